"""``@frozen_dataclass``: ``@dataclass(frozen=True)`` without compiling code for every class.

The config and spec classes are built every time a DAG file that uses tfpipe is parsed, and the
DAG processor parses it again and again. ``@dataclass`` writes the source of six methods per class
(``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``) and
compiles each with ``exec``: on Python 3.11 that was most of tfpipe's own parse cost. This
decorator makes the same class from the same field declarations (annotations, defaults,
``dataclasses.field(...)``) with shared functions instead, and records the fields exactly where
``dataclasses`` keeps them, so ``dataclasses.fields``, ``replace``, ``asdict`` and ``is_dataclass``
work unchanged, and so do equality, hashing, ``repr`` (``field(repr=False)`` included), positional
and keyword construction, ``__post_init__`` and ``dataclasses.FrozenInstanceError`` on assignment.

Anything it does not handle (``InitVar``, keyword-only fields, a Python whose ``dataclasses`` lacks
the field marker it relies on) falls back to ``@dataclass(frozen=True)`` itself.
"""

from __future__ import annotations

import dataclasses
import reprlib
import typing
from typing import Any, TypeVar

_C = TypeVar("_C", bound=type)

_MISSING = dataclasses.MISSING
#: How ``dataclasses`` marks a regular field (not a ClassVar or InitVar pseudo-field);
#: ``dataclasses.fields()`` returns only fields marked so.
_FIELD = getattr(dataclasses, "_FIELD", None)


class _Params:
    """What ``dataclasses`` reads from a base class's ``__dataclass_params__`` (a real dataclass may
    subclass one of these classes; it must then be frozen too, which ``frozen`` tells it)."""

    init = repr = eq = frozen = match_args = True
    order = unsafe_hash = kw_only = slots = weakref_slot = False

    def __repr__(self) -> str:
        return "_DataclassParams(init=True,repr=True,eq=True,order=False,unsafe_hash=False,frozen=True)"


_PARAMS = _Params()


class _Factory:
    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


class _Signature:
    """``inspect.signature(cls)``: built when asked for, never at class creation."""

    def __get__(self, instance: Any, owner: type) -> Any:
        import inspect

        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        return inspect.Signature(
            [inspect.Parameter(f.name, kind, annotation=f.type,
                               default=(f.default if f.default is not _MISSING else
                                        _FACTORY if f.default_factory is not _MISSING else inspect.Parameter.empty))
             for f in dataclasses.fields(owner) if f.init],
            return_annotation=None)


def _is_classvar(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return "ClassVar" in annotation and annotation.split("[", 1)[0].strip() in ("ClassVar", "typing.ClassVar")
    return annotation is typing.ClassVar or typing.get_origin(annotation) is typing.ClassVar


def _is_special(annotation: Any) -> bool:
    """``InitVar`` and ``KW_ONLY``: left to ``dataclasses`` itself."""
    if isinstance(annotation, str):
        if "InitVar" not in annotation and "KW_ONLY" not in annotation:
            return False
        head = annotation.split("[", 1)[0].strip().rsplit(".", 1)[-1]
        return head in ("InitVar", "KW_ONLY")
    return isinstance(annotation, dataclasses.InitVar) or annotation is getattr(dataclasses, "KW_ONLY", None)


def _missing_message(qualname: str, missing: list[str]) -> str:
    """Python's own wording for missing arguments."""
    names = [repr(n) for n in missing]
    if len(names) == 1:
        listed = names[0]
    elif len(names) == 2:
        listed = f"{names[0]} and {names[1]}"
    else:
        listed = ", ".join(names[:-1]) + f", and {names[-1]}"
    plural = "s" if len(names) > 1 else ""
    return f"{qualname}.__init__() missing {len(names)} required positional argument{plural}: {listed}"


def frozen_dataclass(cls: _C) -> _C:
    """Turn ``cls`` into a frozen dataclass, as ``@dataclass(frozen=True)`` would (see the module)."""
    # One pass over the annotations and one over the fields: the decorator runs for every config
    # and spec class on every parse of a DAG file that uses tfpipe.
    namespace = cls.__dict__
    annotations = namespace.get("__annotations__", {})
    own = []
    for name, annotation in annotations.items():
        if _is_special(annotation):
            return dataclasses.dataclass(frozen=True)(cls)
        if _is_classvar(annotation):
            continue
        default = namespace.get(name, _MISSING)
        if default.__class__ is dataclasses.Field and default.kw_only is True:
            return dataclasses.dataclass(frozen=True)(cls)
        own.append((name, annotation, default))
    if _FIELD is None:
        return dataclasses.dataclass(frozen=True)(cls)
    fields: dict[str, dataclasses.Field] = {}
    for base in cls.__mro__[-1:0:-1]:
        fields.update(getattr(base, "__dataclass_fields__", None) or {})
    for name, annotation, default in own:
        declared = default.__class__ is dataclasses.Field
        f = default if declared else dataclasses.field(default=default)
        if f.default is not _MISSING and f.default.__class__.__hash__ is None:
            raise ValueError(f"mutable default {type(f.default)} for field {name} is not allowed: "
                             "use default_factory")
        f.name, f.type, f._field_type = name, annotation, _FIELD
        if hasattr(f, "kw_only"):
            f.kw_only = False
        fields[name] = f
        if declared:  # the class keeps a plain default, as dataclasses does
            if f.default is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
    order, required, shown, compared, hashed = [], [], [], [], []
    seen_default = None
    for f in fields.values():
        if f.init:
            order.append(f.name)
            if f.default is _MISSING and f.default_factory is _MISSING:
                if seen_default:
                    raise TypeError(f"non-default argument {f.name!r} follows default argument")
                required.append(f.name)
            else:
                seen_default = f.name
        if f.repr:
            shown.append(f.name)
        if f.compare:
            compared.append(f.name)
        if f.compare if f.hash is None else f.hash:
            hashed.append(f.name)

    qualname = cls.__qualname__
    plan = tuple((f.name, f.default, f.default_factory) for f in fields.values())
    _define(cls, "__init__", _make_init(cls, qualname, tuple(order), tuple(required), plan))
    _define(cls, "__repr__", _make_repr(tuple(shown)))
    _define(cls, "__eq__", _make_eq(tuple(compared)))
    class_hash = namespace.get("__hash__", _MISSING)
    if class_hash is _MISSING or (class_hash is None and "__eq__" in namespace):
        cls.__hash__ = _make_hash(tuple(hashed))  # type: ignore[assignment]
    names = frozenset(fields)
    for method, make in (("__setattr__", _make_setattr), ("__delattr__", _make_delattr)):
        if method in namespace:
            raise TypeError(f"Cannot overwrite attribute {method} in class {cls.__name__}")
        setattr(cls, method, make(cls, names))
    cls.__dataclass_fields__ = fields  # type: ignore[attr-defined]
    cls.__dataclass_params__ = _PARAMS  # type: ignore[attr-defined]
    if "__match_args__" not in namespace:
        cls.__match_args__ = tuple(order)  # type: ignore[attr-defined]
    if "__signature__" not in namespace:
        cls.__signature__ = _Signature()  # type: ignore[attr-defined]
    return cls


def _define(cls: type, name: str, function: Any) -> None:
    if name not in cls.__dict__:  # a method the class writes itself wins, as with dataclasses
        function.__qualname__ = f"{cls.__qualname__}.{name}"
        setattr(cls, name, function)


def _make_init(cls: type, qualname: str, order: tuple[str, ...], required: tuple[str, ...],
               plan: tuple[tuple[str, Any, Any], ...]) -> Any:
    """``__init__`` taking the fields ``order`` (``required`` among them) positionally or by name;
    ``plan``: (name, default, factory) of every field, in order: what to set when no argument gives it."""
    accepted = frozenset(order)
    post_init = hasattr(cls, "__post_init__")
    low, high = len(required) + 1, len(order) + 1  # Python's count includes self
    takes = (f"takes {high} positional argument{'s' if high > 1 else ''}" if low == high
             else f"takes from {low} to {high} positional arguments")
    set_attribute = object.__setattr__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(order):
            raise TypeError(f"{qualname}.__init__() {takes} but {len(args) + 1} were given")
        values = dict(zip(order, args))
        for key, value in kwargs.items():
            if key not in accepted:
                raise TypeError(f"{qualname}.__init__() got an unexpected keyword argument {key!r}")
            if key in values:
                raise TypeError(f"{qualname}.__init__() got multiple values for argument {key!r}")
            values[key] = value
        if len(values) < len(order):
            missing = [n for n in required if n not in values]
            if missing:
                raise TypeError(_missing_message(qualname, missing))
        for name, default, factory in plan:
            if name in values:
                set_attribute(self, name, values[name])
            elif factory is not _MISSING:
                set_attribute(self, name, factory())
            elif default is not _MISSING:
                set_attribute(self, name, default)
        if post_init:
            self.__post_init__()

    return __init__


def _make_repr(names: tuple[str, ...]) -> Any:
    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{self.__class__.__qualname__}({shown})"

    return __repr__


def _make_eq(names: tuple[str, ...]) -> Any:
    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)

    return __eq__


def _make_hash(names: tuple[str, ...]) -> Any:
    def __hash__(self: Any) -> int:
        return hash(tuple(getattr(self, n) for n in names))

    return __hash__


def _make_setattr(cls: type, names: frozenset[str]) -> Any:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    return __setattr__


def _make_delattr(cls: type, names: frozenset[str]) -> Any:
    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __delattr__
