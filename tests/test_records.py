"""hpcring.records.Record makes the class typing.NamedTuple would: the same fields, defaults,
tuple behaviour, methods and pickling, without typing's per-field check."""

from __future__ import annotations

import pickle
from typing import NamedTuple

import pytest

from hpcring.agreement import Row
from hpcring.algorithms.base import Spec
from hpcring.records import Record


class Made(Record):
    """A record."""

    count: int
    name: str = "x"
    parts: tuple[int, ...] = ()

    def doubled(self) -> int:
        return 2 * self.count


class Typed(NamedTuple):
    """A record."""

    count: int
    name: str = "x"
    parts: tuple[int, ...] = ()


class Sub(Made):
    __slots__ = ()

    def tripled(self) -> int:
        return 3 * self.count


def test_a_record_is_the_named_tuple_typing_makes() -> None:
    made, typed = Made(3, parts=(1, 2)), Typed(3, parts=(1, 2))
    assert made == typed and tuple(made) == (3, "x", (1, 2)) and hash(made) == hash(typed)
    assert Made._fields == Typed._fields and Made._field_defaults == Typed._field_defaults
    assert Made.__match_args__ == Typed.__match_args__ and Made.__doc__ == Typed.__doc__
    assert repr(made) == repr(typed).replace("Typed", "Made")
    assert made._replace(name="y") == (3, "y", (1, 2)) and made._asdict() == typed._asdict()
    assert made.doubled() == 6 and Made._make([1, "a", ()]) == (1, "a", ())
    assert pickle.loads(pickle.dumps(made)) == made and type(pickle.loads(pickle.dumps(made))) is Made
    assert Made.__qualname__ == "Made" and Made.__module__ == __name__
    with pytest.raises(AttributeError):
        made.other = 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        made.count = 4  # type: ignore[misc]
    assert Sub(2).tripled() == 6 and Sub(2).doubled() == 4 and Sub._fields == Made._fields


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((3,), {}), ((3, "y"), {}), ((3, "y", (4,)), {}), ((), {"count": 3}), ((3,), {"parts": (5,)})],
)
def test_a_record_takes_its_arguments_as_the_named_tuple_does(args: tuple, kwargs: dict) -> None:
    made = Made(*args, **kwargs)
    assert made == Typed(*args, **kwargs) and made._asdict() == Typed(*args, **kwargs)._asdict()


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {}), ((1, "a", (), 4), {}), ((3,), {"count": 4}), ((3,), {"other": 1}), ((), {"name": "y"})],
)
def test_a_record_refuses_what_the_named_tuple_refuses(args: tuple, kwargs: dict) -> None:
    with pytest.raises(TypeError):
        Typed(*args, **kwargs)
    with pytest.raises(TypeError):
        Made(*args, **kwargs)
    with pytest.raises(ValueError):
        Made(3)._replace(other=1)


def test_a_field_without_a_default_after_one_with_is_refused() -> None:
    with pytest.raises(TypeError, match="has a default, but a later field has none"):

        class Bad(Record):
            first: int = 0
            second: int


def test_hpcrings_records_keep_their_defaults() -> None:
    """Every field of a Spec has a default (algorithms declare only theirs); a Row has none."""
    assert set(Spec._field_defaults) == set(Spec._fields) and Spec()._replace(name="ring").name == "ring"
    assert not Row._field_defaults
