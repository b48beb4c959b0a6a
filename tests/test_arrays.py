"""The array registry: NumPy always, the by-type lookup and its fallback, the messages, and a
new kind in one file (an immutable toy array that `allreduce` answers with a new array)."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import hpcring
from hpcring import arrays
from hpcring.arrays.base import Adapter, Flags
from hpcring.arrays.numpy import NumpyAdapter


def test_numpy_is_registered_first_and_numbered_the_same_everywhere() -> None:
    assert arrays.adapter_for(np.ones(3)) is arrays.NUMPY
    assert arrays.NAMES[:2] == ["numpy.ndarray", "cupy.ndarray"]  # the agreement's numbers
    assert arrays.NUMPY.index == 0 and arrays.NUMPY.kind == arrays.NUMPY.name == "numpy"
    assert "numpy" in arrays.available()
    assert arrays.adapter_named("numpy") is arrays.NUMPY


def test_a_subclass_is_found_by_asking_then_by_type() -> None:
    class Sub(np.ndarray):
        pass

    x = np.ones(4).view(Sub)
    assert Sub not in arrays._by_type
    assert arrays.adapter_for(x) is arrays.NUMPY
    assert arrays._by_type[Sub] is arrays.NUMPY


def test_anything_else_is_a_type_error_naming_the_kinds() -> None:
    with pytest.raises(TypeError, match=r"^x must be a numpy.ndarray.* got list"):
        arrays.adapter_for([1.0, 2.0])
    # the collective called names itself in front (the engine adds it, once)
    with pytest.raises(TypeError, match=r"^hpcring.allgather: x must be a numpy.ndarray.* got list"):
        hpcring.allgather([1.0, 2.0], comm=MPI.COMM_SELF, check=False)
    with pytest.raises(ValueError, match="array backend 'nope' is not available here"):
        arrays.adapter_named("nope")


def test_numpy_answers_everything_the_protocol_names() -> None:
    names = set(typing.get_type_hints(Adapter)) | {
        name for name, value in vars(Adapter).items() if callable(value) and not name.startswith("_")
    }
    missing = sorted(name for name in names if not hasattr(arrays.NUMPY, name))
    assert not missing


def test_numpy_flat_is_a_view_of_every_byte() -> None:
    x = np.arange(12.0).reshape(3, 4)
    flat = arrays.NUMPY.flat(x)
    assert flat.shape == (12,) and flat is not x and flat.base is x.reshape(-1).base  # as reshape(-1)
    assert arrays.NUMPY.data_pointer(flat) == arrays.NUMPY.data_pointer(x)
    assert arrays.NUMPY.flat(np.empty((0, 3))).shape == (0,)


# --- a new kind: one class and one `register` call ----------------------------------------


class Frozen:
    """A toy immutable array (as a jax.Array is): its values can never be written."""

    def __init__(self, values: Any) -> None:
        self.values = np.array(values)
        self.values.flags.writeable = False


class FrozenAdapter(NumpyAdapter):
    """The user's side answered from `Frozen`; the compute side is NumPy's, inherited."""

    kind = name = "frozen"
    type_name = "tests.Frozen"
    types = (Frozen,)
    immutable = True

    def owns(self, obj: Any) -> bool:
        return isinstance(obj, Frozen)

    def dtype(self, array: Any) -> np.dtype:
        return array.values.dtype

    def shape(self, array: Any) -> tuple[int, ...]:
        return array.values.shape

    def size(self, array: Any) -> int:
        return array.values.size

    def nbytes(self, array: Any) -> int:
        return array.values.nbytes

    def flags(self, array: Any) -> Flags:
        return Flags(array.values.flags.c_contiguous, True)  # the algorithms get a copy

    def shares_memory(self, a: Any, b: Any) -> bool:
        return False

    def flat(self, array: Any) -> np.ndarray:
        return array.values.reshape(-1).copy()

    def result(self, dst: Any, x: Any) -> Frozen:
        return Frozen(dst.reshape(x.values.shape))


@pytest.fixture
def frozen() -> Iterator[FrozenAdapter]:
    adapter = FrozenAdapter()
    arrays.register("frozen", adapter)
    yield adapter
    arrays._registered.pop("frozen")
    arrays._by_type.pop(Frozen)
    arrays._warm.pop(Frozen)
    arrays.NAMES.remove("tests.Frozen")


def test_a_new_kind_registers_in_one_call(frozen: FrozenAdapter) -> None:
    x = Frozen([[1.0, 2.0], [3.0, 4.0]])
    assert arrays.adapter_for(x) is frozen
    assert frozen.index == arrays.NAMES.index("tests.Frozen") >= 2
    assert "frozen" in arrays.available()
    with pytest.raises(TypeError, match=r"or tests.Frozen, got list"):
        arrays.adapter_for([1.0])


def test_an_immutable_kind_gets_a_new_array(frozen: FrozenAdapter) -> None:
    x = Frozen(np.arange(6, dtype=np.float32).reshape(2, 3))
    result = hpcring.allreduce(x, comm=MPI.COMM_SELF)
    assert isinstance(result, Frozen) and result is not x
    assert np.array_equal(result.values, x.values) and result.values.shape == (2, 3)
    with pytest.raises(TypeError, match="dtype int8 is not supported"):
        hpcring.allreduce(Frozen(np.ones(2, np.int8)), comm=MPI.COMM_SELF)
