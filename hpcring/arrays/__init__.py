"""Array adapters, registered by kind: the one place that knows NumPy from CuPy, PyTorch and JAX.

`adapter_for(x)` is the adapter owning a user's array: a dict lookup by ``type(x)`` first, so
a warm call pays no isinstance chain; else each registered adapter is asked (`owns`: a
subclass, or a type several adapters share); else, where the array's library is one whose
adapter is loaded on first sight (CuPy), that adapter is imported, which registers it;
anything else is a TypeError naming the kinds this process accepts.

NumPy's adapter is registered always. CuPy's registers itself when `hpcring.arrays.cupy` is
imported, which happens the first time a CuPy array arrives (or a question needs every
kind): a NumPy user never imports CuPy. A new kind is one module that calls `register` at
import, and its line in `SHIPPED` (see `base` for what an adapter answers).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from .base import Adapter
from .numpy import NumpyAdapter

_by_type: dict[type, Adapter] = {}  # exact type -> its adapter
# exact type -> the adapter a warm call asks: _by_type, plus each adapter's ``warm_types``, types
# it may not own by type alone (a torch.Tensor may be on a GPU) but whose `ready` tells
_warm: dict[type, Adapter] = {}
_registered: dict[str, Adapter] = {}  # kind -> adapter, in registration order

# Every kind hpcring ships: what messages call its arrays, the top-level modules of their
# types (space-separated: a jax.Array's type lives in jaxlib, a tracer's in jax), and the module
# of its adapter (None: registered here, always). The agreement row carries a call's array kind
# as its place in this table, which so means the same on every rank whichever libraries import
# there; a kind from outside hpcring is numbered after these, in the order of registering (the
# same on every rank where every rank registers it alike).
SHIPPED: tuple[tuple[str, str, str | None], ...] = (
    ("numpy.ndarray", "numpy", None),
    ("cupy.ndarray", "cupy", "hpcring.arrays.cupy"),
    # PyTorch: a CPU tensor computes as NumPy, a CUDA one as CuPy, so two kinds (see `base`).
    ("torch.Tensor (CPU)", "torch", "hpcring.arrays.torch"),
    ("torch.Tensor (CUDA)", "torch", "hpcring.arrays.torch"),
    ("jax.Array", "jax jaxlib", "hpcring.arrays.jax"),
)
NAMES: list[str] = [name for name, _, _ in SHIPPED]  # by agreement number, for messages

# Adapters of optional libraries, by the top-level module of their arrays' type: imported on
# the first such array (the library is loaded by then: the user made the array with it).
_ON_FIRST_SIGHT: dict[str, str] = {
    top: module for _, tops, module in SHIPPED if module is not None for top in tops.split()
}
# Libraries `_load_all` imports only where the user already has (seconds each otherwise).
_IF_IMPORTED = frozenset({"torch", "jax", "jaxlib"})


def register(kind: str, adapter: Adapter) -> None:
    """Make ``adapter`` the owner of its ``types`` (exactly) and of whatever its `owns` accepts."""
    if adapter.type_name not in NAMES:
        NAMES.append(adapter.type_name)
    adapter.index = NAMES.index(adapter.type_name)
    _registered[kind] = adapter
    for cls in adapter.types:
        _by_type[cls] = _warm[cls] = adapter
    for cls in getattr(adapter, "warm_types", ()):
        _warm[cls] = adapter


def adapter_for(obj: Any) -> Adapter:
    """The adapter that owns ``obj``; TypeError for anything that is not an array of a registered kind."""
    adapter = _by_type.get(type(obj))
    if adapter is not None:
        return adapter
    return _search(obj)


def known_adapter(obj: Any) -> Adapter | None:
    """The adapter a warm call asks about ``obj``'s exact type, where there is one (its `ready`,
    not this lookup, says whether ``obj`` is one it owns)."""
    return _warm.get(obj.__class__)


def _search(obj: Any) -> Adapter:
    """`adapter_for` past the by-type lookup: ask each adapter, then load the one of ``obj``'s library."""
    for _ in range(2):
        for adapter in list(_registered.values()):
            if adapter.owns(obj):
                if adapter.by_type:
                    _by_type[type(obj)] = _warm[type(obj)] = adapter  # a subclass: by type from now on
                return adapter
        module = _ON_FIRST_SIGHT.get(type(obj).__module__.partition(".")[0])
        if module is None or not _load(module):
            break
    _load_all()
    names = [adapter.type_name for adapter in _registered.values()]
    kinds = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    raise TypeError(f"x must be a {kinds}, got {type(obj).__name__}")


def _load(module: str) -> bool:
    """Import the adapter ``module`` (it registers itself); False where its library does not import."""
    try:
        importlib.import_module(module)
    except ImportError:
        for top, name in list(_ON_FIRST_SIGHT.items()):
            if name == module:
                del _ON_FIRST_SIGHT[top]  # asked once: its arrays cannot occur in this process
        return False
    return True


def _load_all() -> None:
    """Every adapter whose library imports here, registered: for questions about all kinds
    (a framework's only once the user has imported it)."""
    for top, module in list(_ON_FIRST_SIGHT.items()):
        if top not in _IF_IMPORTED or top in sys.modules:
            _load(module)


def available() -> list[str]:
    """Array kinds usable in this process: always numpy, cupy where a GPU is visible, torch and
    jax where the user imported them (torch_cuda where CuPy sees a GPU too)."""
    _load_all()
    return [kind for kind, adapter in _registered.items() if not adapter.problem()]


def device_key(adapter: Adapter) -> Any:
    """What tells apart the places a call's arrays live: the adapter, and the device for one that
    has several. Scratch, schedules and NCCL's communicator live on the GPU they were made on,
    and a rank may switch GPUs between calls (``with cupy.cuda.Device(i):``), so channels are
    kept per key."""
    device = adapter.current_device()
    return adapter.name if device is None else (adapter.name, device)


def adapter_named(kind: str) -> Adapter:
    """The adapter of ``kind`` (one of `available`), for code that has no array yet."""
    usable = available()
    if kind not in usable:
        raise ValueError(f"array backend {kind!r} is not available here; choose one of {usable}")
    return _registered[kind]


NUMPY: Adapter = NumpyAdapter()  # host memory: also the fallback where a call's array was refused
register("numpy", NUMPY)

__all__ = ["NAMES", "NUMPY", "Adapter", "adapter_for", "adapter_named", "available", "device_key", "register"]
