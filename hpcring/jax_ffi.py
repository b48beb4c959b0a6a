"""hpcring.jax's XLA FFI target: loading it, registering it with XLA, and lowering to it.

``hpcring._jax_ffi`` (hpcring/_c/jax_ffi.cc) is one XLA FFI handler. A jitted program calls it in
place of the collective, with XLA's buffers: it wraps them as NumPy arrays, without a copy, and
calls `hpcring.engine.call`, the entry every front end uses. So inside ``jit`` a collective is the
same call as outside it (the agreement, the timeouts and `StallError`, every algorithm and dtype,
the same bits), and a warm all-reduce, broadcast, reduce-scatter or all-gather runs in the compiled
core from the arguments to the result. An error reaches the host as JAX raises a failed execution
(``JaxRuntimeError``, or ``ValueError`` from JAX's C++ dispatch), its message XLA's code, then
hpcring's exception type and text (``DEADLINE_EXCEEDED: hpcring.errors.StallError: ...``).

**Ordering.** Every rank must run its collectives in the same order. Within a function body the
lowered calls are chained by XLA tokens: each takes the token the previous one returned, so XLA
keeps them in program order and never runs two at once. The chain lives in the lowering, not in
a JAX effect: a JAX effect (ordered or not) takes a jitted function off JAX's C++ dispatch path,
which costs about 100 us per call, most of mpi4jax's time at small sizes. Successive executions
keep their order without tokens: JAX's CPU client runs the executions of one device one after
the other, in the order they were dispatched. A collective inside a nested jitted function or a
control-flow body (scan, while, cond) starts a chain of its own: XLA:CPU runs every call that
takes a token one at a time, in the order of its schedule, which every rank compiles alike, so
the ranks still meet. hpcring's agreement checks what each rank called at every call, so a rank
that runs another collective, or another shape, raises on every rank instead of hanging.

Call sites are numbered while lowering (``site``, an int64 attribute of the custom call) and the
number indexes this process's table of `engine.call` arguments, so a program compiled or
exported elsewhere is refused, not misread.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from . import config

TARGET = "hpcring_collective"
# The handler's collective kinds (hpcring/_c/jax_ffi.cc: K_ALLREDUCE...).
KINDS = {"allreduce": 0, "reduce_scatter": 1, "allgather": 2, "broadcast": 3}

_STATE: list[Any] = []  # [the set-up extension module or None, why, its platforms], made on first use
_SITES: dict[tuple[Any, ...], int] = {}  # a call site's arguments -> its number in the module's table
_CHAINS = ("hpcring.jax", "token chains")  # key of the token chains in a module's lowering cache


def target() -> tuple[Any, str]:
    """The FFI extension, set up and registered with XLA, or None; and why (hpcring.info()["jax"])."""
    if not _STATE:
        _STATE[:] = _load()
    return _STATE[0], _STATE[1]


def platforms() -> list[str]:
    """The JAX platforms the target is registered for ("cpu", and "cuda" where that handler is)."""
    target()
    return _STATE[2]


def describe() -> tuple[str, str]:
    """("ffi" or "callback", why) without importing JAX: what `hpcring.jax` runs in this process."""
    if _STATE:
        return ("ffi" if _STATE[0] is not None else "callback"), _STATE[1]
    why = _refusal()
    if why:
        return "callback", why
    if importlib.util.find_spec("jax") is None:
        return "callback", "JAX is not installed"
    try:
        importlib.import_module("hpcring._jax_ffi")
    except ImportError as error:
        return "callback", _not_built(error)
    return "ffi", f"{_ABOUT} (registered with XLA at hpcring.jax's first call)"


_ABOUT = "hpcring._jax_ffi: an XLA FFI custom call into hpcring's engine, no Python callback"


def _refusal() -> str:
    return "HPCRING_JAX=callback" if config.current().jax == "callback" else ""


def _not_built(error: Exception) -> str:
    return (
        f"hpcring._jax_ffi did not load ({type(error).__name__}: {error}); it builds where JAX imports "
        "at build time: pip install --no-build-isolation (-e . in a clone) once JAX is installed"
    )


def _load() -> tuple[Any, str, list[str]]:
    why = _refusal()
    if why:
        return None, why, []
    try:
        module = importlib.import_module("hpcring._jax_ffi")
    except ImportError as error:
        return None, _not_built(error), []
    import jax
    import numpy as np

    from . import engine
    from .ops import BFLOAT16

    dtypes = {
        code: (BFLOAT16 if name == "bfloat16" else np.dtype(name)) for name, code in module.XLA_TYPES.items()
    }
    module.setup(engine.call, _error_text(module.ERROR_CODES), dtypes)
    jax.ffi.register_ffi_target(TARGET, module.handler(), platform="cpu")
    cuda, why = _cuda(module)
    return module, f"{_ABOUT} (CPU{why})", ["cpu", "cuda"] if cuda else ["cpu"]


def _cuda(module: Any) -> tuple[bool, str]:
    """Register the CUDA handler where it built, a CUDA device is there and JAX has CUDA: whether
    it is registered, and what to say about it."""
    try:
        cuda = importlib.import_module("hpcring._jax_ffi_cuda")
    except ImportError:
        return False, ""
    import jax

    if cuda.devices() < 1:
        return False, "; the CUDA handler is built, no CUDA device here"
    try:
        jax.devices("cuda")
    except RuntimeError:
        return False, "; the CUDA handler is built, JAX has no CUDA backend here"
    cuda.setup(module.RUN)
    jax.ffi.register_ffi_target(TARGET, cuda.handler(), platform="CUDA")
    return True, "; CUDA buffers staged through host memory"


def _error_text(codes: dict[str, int]) -> Any:
    """The function the handler turns an exception into (XLA error code, text) with."""
    from .errors import RankFailedError, StallError

    by_type = [
        (StallError, codes["DEADLINE_EXCEEDED"]),
        (RankFailedError, codes["ABORTED"]),
        (MemoryError, codes["RESOURCE_EXHAUSTED"]),
        (NotImplementedError, codes["UNIMPLEMENTED"]),
        ((TypeError, ValueError), codes["INVALID_ARGUMENT"]),
    ]

    def text(error: BaseException) -> tuple[int, str]:
        kind = type(error)
        name = (
            kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        )
        code = next((c for types, c in by_type if isinstance(error, types)), codes["INTERNAL"])
        return code, f"{name}: {error}"

    return text


def site(module: Any, collective: str, args: tuple[Any, ...], key: tuple[Any, ...]) -> int:
    """The number of a call site: ``args`` are `engine.call`'s (x and out left None), ``key`` a
    hashable form of them; the same site is listed once."""
    number = _SITES.get(key)
    if number is None:
        number = _SITES[key] = module.site(KINDS[collective], args)
    return number


def reusable(x: Any) -> bool:
    """Whether a result may be written over operand ``x``: a value the program computed (XLA
    copies it first only where it is still needed), or an argument the caller donated. Any other
    argument is written to a new buffer, as a copy of it would cost more."""
    from jax.extend.mlir import ir

    if not isinstance(x, ir.BlockArgument):
        return True
    owner = x.owner.owner
    if owner.operation.name != "func.func" or "arg_attrs" not in owner.attributes:
        return False
    attrs = owner.attributes["arg_attrs"][x.arg_number]
    return "tf.aliasing_output" in attrs or "jax.buffer_donor" in attrs


def lower(ctx: Any, x: Any, *, number: int, alias: bool) -> list[Any]:
    """The custom call of site ``number`` on ``x``, chained to the previous one of this block."""
    import jax
    import numpy as np
    from jax.extend.mlir import ir
    from jax.extend.mlir.dialects import stablehlo

    chains = ctx.module_context.cached_primitive_lowerings.setdefault(_CHAINS, {})
    block = ir.InsertionPoint.current.block
    token = chains.get(block)
    if token is None:
        token = stablehlo.create_token()
    abstract = _abstract_token()
    inner = ctx.replace(avals_in=(*ctx.avals_in, abstract), avals_out=(*ctx.avals_out, abstract))
    rule = jax.ffi.ffi_lowering(
        TARGET, has_side_effect=True, operand_output_aliases={0: 0} if alias else None
    )
    result, chains[block] = rule(inner, x, token, site=np.int64(number))
    return [result]


def _abstract_token() -> Any:
    try:  # JAX 0.11 makes it public
        from jax.ffi import abstract_token  # type: ignore[attr-defined]
    except ImportError:
        from jax._src.core import abstract_token
    return abstract_token


__all__ = ["KINDS", "TARGET", "describe", "lower", "site", "target"]
