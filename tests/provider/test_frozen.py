"""``frozen_dataclass`` builds the same class ``@dataclass(frozen=True)`` does, without code generation."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from tfpipe.config import PipelineConfig, ResourcesConfig, TrainingConfig
from tfpipe.frozen import frozen_dataclass


def _pair(*bases: type) -> tuple[type, type]:
    """The same class body under ``@dataclass(frozen=True)`` and under ``@frozen_dataclass``."""

    def body(decorate: Any, base: tuple[type, ...]) -> type:
        class Example(*base):
            """An example."""

            kind: ClassVar[str] = "example"
            name: str
            count: int = 3
            tags: tuple = ("a",)
            extra: Mapping = field(default_factory=dict)
            secret: str = field(default="s", repr=False)
            seen: list = field(default_factory=list, compare=False)

            def __post_init__(self) -> None:
                object.__setattr__(self, "tags", tuple(self.tags))

        return decorate(Example)

    return body(dataclass(frozen=True), bases), body(frozen_dataclass, bases)


def test_fields_defaults_and_signature_match_dataclasses():
    real, fast = _pair()
    describe = lambda cls: [(f.name, f.type, f.default, f.default_factory, f.init, f.repr, f.compare, f.hash)  # noqa: E731
                            for f in dataclasses.fields(cls)]
    assert describe(fast) == describe(real)
    assert dataclasses.is_dataclass(fast) and fast.__match_args__ == real.__match_args__
    assert str(inspect.signature(fast)) == str(inspect.signature(real))
    assert fast.count == real.count == 3 and not hasattr(fast, "extra") and not hasattr(real, "extra")
    assert fast.kind == "example" and fast.__doc__ == "An example."


def test_instances_behave_alike():
    real, fast = _pair()
    for cls in (real, fast):
        one = cls("x", 4, ["b"], {"k": "v"})
        assert one.tags == ("b",), "__post_init__ ran"
        assert one == cls(name="x", count=4, tags=("b",), extra={"k": "v"}, seen=[1]), "seen is not compared"
        assert one != cls("y") and one.__eq__(object()) is NotImplemented
        assert dataclasses.replace(one, count=5).count == 5
        assert dataclasses.asdict(one) == {"name": "x", "count": 4, "tags": ("b",), "extra": {"k": "v"},
                                           "secret": "s", "seen": []}
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'count'"):
            one.count = 1
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'count'"):
            del one.count
        assert cls("x").extra is not cls("x").extra, "a fresh dict from the factory each time"
    assert repr(fast("x")).replace("Example", "E") == repr(real("x")).replace("Example", "E")
    assert "secret" not in repr(fast("x"))
    frozen_hashable = frozen_dataclass(type("H", (), {"__annotations__": {"a": "int", "b": "str"}}))
    assert hash(frozen_hashable(1, "b")) == hash((1, "b")) == hash(frozen_hashable(a=1, b="b"))


@pytest.mark.parametrize(("args", "kwargs"), [
    ((), {}),                                 # a required argument missing
    (("x", 1, (), {}, "s", [], "extra"), {}),  # too many positional arguments
    (("x",), {"name": "y"}),                  # given twice
    (("x",), {"colour": "red"}),              # unknown keyword
])
def test_wrong_arguments_raise_the_same_type_error(args, kwargs):
    real, fast = _pair()
    with pytest.raises(TypeError) as expected:
        real(*args, **kwargs)
    with pytest.raises(TypeError) as got:
        fast(*args, **kwargs)
    assert str(got.value) == str(expected.value)


def test_a_value_that_holds_its_own_object_shows_as_dots_as_with_dataclasses():
    """``repr`` of an object reached again while it is being shown is ``...`` (dataclasses uses
    ``reprlib.recursive_repr``; this module one guard for all classes), and only inside that call."""
    real, fast = _pair()
    for cls in (real, fast):
        box: list = []
        one = cls("x", extra={"box": box})
        box.append(one)
        assert repr(one).endswith("Example(name='x', count=3, tags=('a',), extra={'box': [...]}, seen=[])"), cls
        assert repr(box) == f"[{repr(one)}]" and repr(one) == repr(one)
    assert repr(fast("x", extra={"b": fast("y")})).count("name=") == 2, "a different object is shown"


@pytest.mark.parametrize(("declared", "namespace"), [
    ({"a": "int"}, {}),                     # one accepted: "takes 2 positional arguments"
    ({"a": "int", "b": "int"}, {"b": 1}),   # a range: "takes from 2 to 3"
    ({"a": "int"}, {"a": 1}),               # none required
], ids=["one", "range", "none-required"])
@pytest.mark.parametrize("extra", [1, 3])
def test_too_many_positional_arguments_are_counted_as_python_counts_them(declared, namespace, extra):
    """Python's wording for too many positional arguments, whatever the class accepts."""
    real = dataclass(frozen=True)(type("T", (), {"__annotations__": declared, **namespace}))
    fast = frozen_dataclass(type("T", (), {"__annotations__": declared, **namespace}))
    given = range(len(declared) + extra)
    with pytest.raises(TypeError) as expected:
        real(*given)
    with pytest.raises(TypeError) as got:
        fast(*given)
    assert str(got.value) == str(expected.value)


def test_missing_arguments_are_named_as_python_names_them():
    two = frozen_dataclass(type("Two", (), {"__annotations__": {"a": "int", "b": "int", "c": "int"}}))
    with pytest.raises(TypeError, match=r"missing 3 required positional arguments: 'a', 'b', and 'c'"):
        two()
    with pytest.raises(TypeError, match=r"missing 2 required positional arguments: 'b' and 'c'"):
        two(1)


def test_declaration_mistakes_are_refused_as_dataclasses_refuses_them():
    with pytest.raises(ValueError, match="mutable default"):
        frozen_dataclass(type("Bad", (), {"__annotations__": {"a": "list"}, "a": []}))
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        frozen_dataclass(type("Bad", (), {"__annotations__": {"a": "int", "b": "int"}, "a": 1}))


def test_subclasses_inherit_fields_and_a_real_dataclass_may_extend_one():
    _, base = _pair()

    @frozen_dataclass
    class Child(base):
        more: int = 7

    @dataclass(frozen=True)
    class Real(base):
        most: int = 8

    assert [f.name for f in dataclasses.fields(Child)][-1] == "more" and Child("x").more == 7
    assert Real("x").most == 8 and Real("x").count == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        Real("x").most = 1


def test_the_config_classes_are_frozen_dataclasses():
    cfg = PipelineConfig.from_dict({"dag_id": "d", "image": {"ref": "img:1.0"}, "data": {"path": "x.csv"},
                                    "volumes": {"data": "/d", "work": "/w", "models": "/m"}})
    assert dataclasses.replace(cfg, retries=1).retries == 1 and cfg.retries == 3
    assert cfg == PipelineConfig.from_dict(dataclasses.asdict(cfg))
    assert "private_environment" not in repr(ResourcesConfig(private_environment={"TOKEN": "x"}))
    assert TrainingConfig(epochs=3) == TrainingConfig(epochs=3) != TrainingConfig(epochs=4)
    assert hash(TrainingConfig.__dataclass_fields__["epochs"].default) == hash(10)


def test_to_dict_is_asdict_made_json_ready():
    """``to_dict`` skips ``asdict``'s deep copy and gives the same dicts: for every section, with
    its defaults and with tuples, mappings and a nested dataclass in it, and for a real dataclass
    (whose ClassVar pseudo-fields ``asdict`` leaves out)."""
    from tfpipe.config import GpuRequest, _Section, json_ready

    cfg = PipelineConfig.from_dict({"dag_id": "d", "image": {"ref": "img:1.0"}, "data": {"path": "x.csv"},
                                    "volumes": {"data": "/d", "work": "/w", "models": "/m"}})
    sections = [ResourcesConfig(private_environment={"TOKEN": "x"}, gpus="0,1", environment={"A": "b"}),
                TrainingConfig(epochs=3)]
    sections += [getattr(cfg, f.name) for f in dataclasses.fields(cfg) if isinstance(getattr(cfg, f.name), _Section)]
    assert len(sections) > 10
    for section in sections:
        assert section.to_dict() == json_ready(dataclasses.asdict(section)), type(section).__name__
    nested = {"request": GpuRequest.parse("2"), "names": ("a", "b")}
    assert json_ready(nested) == {"request": json_ready(dataclasses.asdict(nested["request"])), "names": ["a", "b"]}
    real, _ = _pair()
    assert json_ready(real("x")) == json_ready(dataclasses.asdict(real("x")))
    assert "kind" not in json_ready(real("x"))
