"""`Record`: the base of hpcring's NamedTuples, made without typing's check of every field.

``class Spec(Record)`` with annotated fields, defaults, a docstring and methods is the class
``class Spec(typing.NamedTuple)`` would be: a tuple with a named field for each annotation, its
defaults, ``_replace``, ``_asdict``, ``_make``, its repr and pickling, and the body's methods.
typing.NamedTuple also checks each field's annotation, and under ``from __future__ import
annotations`` each is a string it compiles into a ForwardRef. For the ten records a first
all-reduce loads, that took 2.4-3.0 ms of a 20 ms first call (0.1-0.6 ms a class), in every
process. collections.namedtuple, which it calls, compiles a ``__new__`` for each class: 65-75 us
a class more than `_Maker`'s one class with shared methods (11 us). Type checkers see
typing.NamedTuple itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter
from typing import TYPE_CHECKING, Any, ClassVar

try:  # what collections.namedtuple's fields are: a C descriptor, faster to read than a property
    from _collections import _tuplegetter
except ImportError:  # another Python: the same, as a property

    def _tuplegetter(index: int, doc: str) -> Any:
        return property(itemgetter(index), doc=doc)


_NOT_COPIED = ("__dict__", "__weakref__", "__orig_bases__", "__annotations__")


class _Fields(tuple):
    """What every record shares: collections.namedtuple's methods, written once."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    _field_defaults: ClassVar[dict[str, Any]] = {}

    _tail: ClassVar[tuple[Any, ...]] = ()  # the defaults, in field order (they are the last fields')

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if not kwargs:  # positional arguments, the rest from the defaults: the common call, fast
            missing = len(cls._fields) - len(args)
            if missing == 0:
                return tuple.__new__(cls, args)
            if 0 < missing <= len(cls._tail):
                return tuple.__new__(cls, args + cls._tail[len(cls._tail) - missing :])
        fields, defaults = cls._fields, cls._field_defaults
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__}() takes {len(fields)} arguments but {len(args)} were given")
        values = list(args)
        for field in fields[len(args) :]:
            if field in kwargs:
                values.append(kwargs.pop(field))
            elif field in defaults:
                values.append(defaults[field])
            else:
                raise TypeError(f"{cls.__name__}() missing required argument: {field!r}")
        if kwargs:
            raise TypeError(
                f"{cls.__name__}() got an unexpected or repeated keyword argument {next(iter(kwargs))!r}"
            )
        return tuple.__new__(cls, values)

    @classmethod
    def _make(cls, iterable: Iterable[Any]) -> Any:
        made = tuple.__new__(cls, iterable)
        if len(made) != len(cls._fields):
            raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(made)}")
        return made

    def _replace(self, **changes: Any) -> Any:
        made = self._make(
            [changes.pop(field, value) for field, value in zip(self._fields, self, strict=True)]
        )
        if changes:
            raise ValueError(f"Got unexpected field names: {list(changes)!r}")
        return made

    def _asdict(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))

    def __repr__(self) -> str:
        shown = ", ".join(f"{field}={value!r}" for field, value in zip(self._fields, self, strict=True))
        return f"{type(self).__name__}({shown})"

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self)


class _Maker(type):
    """Makes each subclass of `Record` a tuple of its annotated fields (`_Fields`' methods)."""

    def __new__(cls, name: str, bases: tuple[type, ...], body: dict[str, Any]) -> Any:
        if not bases:  # Record itself
            return super().__new__(cls, name, bases, body)
        fields = tuple(body.get("__annotations__", {}))
        defaults = {field: body[field] for field in fields if field in body}
        first = len(fields) - len(defaults)  # as namedtuple's, the defaults are the last fields'
        for field in fields[:first]:
            if field in body:
                raise TypeError(f"{name}: field {field!r} has a default, but a later field has none")
        kept = {k: v for k, v in body.items() if k not in fields and k not in _NOT_COPIED}
        kept.update(__slots__=(), _fields=fields, _field_defaults=defaults, __match_args__=fields)
        kept["_tail"] = tuple(defaults.values())
        kept.setdefault("__doc__", f"{name}({', '.join(fields)})")
        for index, field in enumerate(fields):
            kept[field] = _tuplegetter(index, f"Alias for field number {index}")
        return type(name, (_Fields,), kept)


if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:

    class Record(metaclass=_Maker):
        """Subclass it as typing.NamedTuple (module docstring)."""


__all__ = ["Record"]
