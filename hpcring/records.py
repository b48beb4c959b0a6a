"""`Record`: the base of hpcring's NamedTuples, made without typing's check of every field.

``class Spec(Record)`` with annotated fields, defaults, a docstring and methods is the class
``class Spec(typing.NamedTuple)`` would be: a collections.namedtuple with the body's methods.
typing.NamedTuple also checks each field's annotation, and under ``from __future__ import
annotations`` each is a string it compiles into a ForwardRef. For the ten records a first
all-reduce loads, that took 2.4-3.0 ms of a 20 ms first call (0.1-0.6 ms a class), in every
process. Type checkers see typing.NamedTuple itself.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

_NOT_COPIED = ("__dict__", "__weakref__", "__orig_bases__")


class _Maker(type):
    """Makes each subclass of `Record` a collections.namedtuple of its annotated fields."""

    def __new__(cls, name: str, bases: tuple[type, ...], body: dict[str, Any]) -> Any:
        if not bases:  # Record itself
            return super().__new__(cls, name, bases, body)
        fields = tuple(body.get("__annotations__", {}))
        defaults = [body[field] for field in fields if field in body]
        first = len(fields) - len(defaults)  # namedtuple's defaults are the last fields'
        for field in fields[:first]:
            if field in body:
                raise TypeError(f"{name}: field {field!r} has a default, but a later field has none")
        made = collections.namedtuple(name, fields, defaults=defaults, module=body.get("__module__"))
        kept = {k: v for k, v in body.items() if k not in fields and k not in _NOT_COPIED}
        kept["__slots__"] = ()
        return type(name, (made,), kept)


if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:

    class Record(metaclass=_Maker):
        """Subclass it as typing.NamedTuple (module docstring)."""


__all__ = ["Record"]
