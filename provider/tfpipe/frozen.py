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

import _thread
import dataclasses
import typing
from typing import Any, TypeVar

_C = TypeVar("_C", bound=type)

_MISSING = dataclasses.MISSING
#: How ``dataclasses`` marks a regular field (not a ClassVar or InitVar pseudo-field);
#: ``dataclasses.fields()`` returns only fields marked so.
_FIELD = getattr(dataclasses, "_FIELD", None)
#: Whether fields have ``kw_only`` (Python 3.10 on): every field made here is positional.
_HAS_KW_ONLY = "kw_only" in dataclasses.Field.__slots__


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


_SIGNATURE = _Signature()


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


def _too_many_message(qualname: str, required: int, accepted: int, given: int) -> str:
    """Python's own wording for too many positional arguments (its counts include ``self``)."""
    low, high = required + 1, accepted + 1
    takes = (f"takes {high} positional argument{'s' if high > 1 else ''}" if low == high
             else f"takes from {low} to {high} positional arguments")
    return f"{qualname}.__init__() {takes} but {given + 1} were given"


def frozen_dataclass(cls: _C) -> _C:
    """Turn ``cls`` into a frozen dataclass, as ``@dataclass(frozen=True)`` would (see the module)."""
    # Every config and spec class goes through here on every parse of a DAG file that uses tfpipe,
    # about 150 fields in all: one pass over the annotations, one over the fields, and per field
    # only what a plain annotated field needs (the ClassVar/InitVar/KW_ONLY tests run only for an
    # annotation that names one of them, or is not a string).
    if _FIELD is None:
        return dataclasses.dataclass(frozen=True)(cls)
    namespace = cls.__dict__
    fields: dict[str, dataclasses.Field] = {}
    for base in cls.__mro__[-2:0:-1]:  # object has no fields
        inherited = getattr(base, "__dataclass_fields__", None)
        if inherited:
            fields.update(inherited)
    own: list[dataclasses.Field] = []
    declared: list[dataclasses.Field] = []
    for name, annotation in namespace.get("__annotations__", {}).items():
        if (annotation.__class__ is not str or "ClassVar" in annotation or "InitVar" in annotation
                or "KW_ONLY" in annotation):
            if _is_special(annotation):
                return dataclasses.dataclass(frozen=True)(cls)
            if _is_classvar(annotation):
                continue
        default = namespace.get(name, _MISSING)
        if default.__class__ is dataclasses.Field:
            if default.kw_only is True:
                return dataclasses.dataclass(frozen=True)(cls)
            f = default
            declared.append(f)
        else:
            f = dataclasses.field(default=default)
        if f.default is not _MISSING and f.default.__class__.__hash__ is None:
            raise ValueError(f"mutable default {type(f.default)} for field {name} is not allowed: "
                             "use default_factory")
        f.name, f.type, f._field_type = name, annotation, _FIELD
        own.append(f)
    for f in own:  # the class is changed only once nothing can fall back to dataclasses any more
        if _HAS_KW_ONLY:
            f.kw_only = False
        fields[f.name] = f
    for f in declared:  # the class keeps a plain default, as dataclasses does
        if f.default is _MISSING:
            delattr(cls, f.name)
        else:
            setattr(cls, f.name, f.default)
    order, required, shown, compared, hashed, plan = [], [], [], [], [], []
    seen_default = None
    for f in fields.values():
        name = f.name
        if f.init:
            order.append(name)
            if f.default is _MISSING and f.default_factory is _MISSING:
                if seen_default:
                    raise TypeError(f"non-default argument {name!r} follows default argument")
                required.append(name)
            else:
                seen_default = name
        if f.repr:
            shown.append(name)
        if f.compare:
            compared.append(name)
        if f.compare if f.hash is None else f.hash:
            hashed.append(name)
        plan.append((name, f.default, f.default_factory))

    qualname = cls.__qualname__
    _define(cls, qualname, "__init__", _make_init(cls, qualname, tuple(order), tuple(required), tuple(plan)))
    _define(cls, qualname, "__repr__", _make_repr(tuple(shown)))
    _define(cls, qualname, "__eq__", _make_eq(tuple(compared)))
    class_hash = namespace.get("__hash__", _MISSING)
    if class_hash is _MISSING or (class_hash is None and "__eq__" in namespace):
        cls.__hash__ = _make_hash(tuple(hashed))  # type: ignore[assignment]
    if "__setattr__" in namespace or "__delattr__" in namespace:
        method = "__setattr__" if "__setattr__" in namespace else "__delattr__"
        raise TypeError(f"Cannot overwrite attribute {method} in class {cls.__name__}")
    names = frozenset(fields)
    cls.__setattr__ = _make_setattr(cls, names)  # type: ignore[method-assign, assignment]
    cls.__delattr__ = _make_delattr(cls, names)  # type: ignore[method-assign, assignment]
    cls.__dataclass_fields__ = fields  # type: ignore[attr-defined]
    cls.__dataclass_params__ = _PARAMS  # type: ignore[attr-defined]
    if "__match_args__" not in namespace:
        cls.__match_args__ = tuple(order)  # type: ignore[attr-defined]
    if "__signature__" not in namespace:
        cls.__signature__ = _SIGNATURE  # type: ignore[attr-defined]
    return cls


def _define(cls: type, qualname: str, name: str, function: Any) -> None:
    if name not in cls.__dict__:  # a method the class writes itself wins, as with dataclasses
        function.__qualname__ = f"{qualname}.{name}"
        setattr(cls, name, function)


def _make_init(cls: type, qualname: str, order: tuple[str, ...], required: tuple[str, ...],
               plan: tuple[tuple[str, Any, Any], ...]) -> Any:
    """``__init__`` taking the fields ``order`` (``required`` among them) positionally or by name;
    ``plan``: (name, default, factory) of every field, in order: what to set when no argument gives it."""
    accepted = frozenset(order)
    post_init = hasattr(cls, "__post_init__")
    set_attribute = object.__setattr__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(order):
            raise TypeError(_too_many_message(qualname, len(required), len(order), len(args)))
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


#: (id of the object, thread) of every ``__repr__`` running: a value that contains its own object
#: shows as ``...``, as ``reprlib.recursive_repr`` (what dataclasses uses) does; one set for all
#: classes, where ``recursive_repr`` would make one wrapper per class.
_REPR_RUNNING: set[tuple[int, int]] = set()


def _make_repr(names: tuple[str, ...]) -> Any:
    def __repr__(self: Any) -> str:
        key = (id(self), _thread.get_ident())
        if key in _REPR_RUNNING:
            return "..."
        _REPR_RUNNING.add(key)
        try:
            shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        finally:
            _REPR_RUNNING.discard(key)
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
