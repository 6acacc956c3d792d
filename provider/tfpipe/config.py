"""Pipeline configuration: frozen pydantic models, one per concern, validated when constructed.

Runs at DAG-parse time, so no I/O: errors name the field and the fix (:class:`TfpipeConfigError`).
Paths are on the Docker engine's host and checked for form only. The stage sections (``data``,
``training``, ``evaluation``, ``export``) are generated from the contract's schema
(:data:`tfpipe.contract.SECTIONS`); this module adds only the checks the schema cannot express.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Annotated, Any, ClassVar, Literal, Optional

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from tfpipe import contract


class TfpipeConfigError(ValueError):
    """A pipeline or operator argument is wrong; the message names the field and the fix.

    Raised at DAG-parse time, so a bad config shows up as a DAG import error in the UI instead of
    a failed run.
    """


#: The Airflow Variable holding the trainer image reference of a deployment: what a pipeline runs
#: when its ``image.ref`` is left unset (read by :func:`tfpipe.settings.resolve_image` at run time).
IMAGE_VARIABLE = "tfpipe_image"

#: Tags that move: an image referenced by one of these is not reproducible.
FLOATING_TAGS = frozenset({"latest", "stable", "nightly", "gpu", "latest-gpu", "devel", "devel-gpu", "edge"})
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock", "/var/run", "/run")
#: Airflow's limit on a DAG tag's length (longer tags fail the DAG's serialization).
TAG_MAX_LEN = 100
CRON_PRESETS = frozenset({"@once", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly",
                          "@annually", "@midnight", "@continuous"})

# For ``re.fullmatch``: ASCII classes (Docker reads ASCII digits only), no ``$`` (it lets a trailing newline in).
_NAME = re.compile(contract.NAME_PATTERN)
_SIZE = re.compile(r"[0-9]+(\.[0-9]+)?[bkmgBKMG]?")
_USER = re.compile(r"[0-9]+(:[0-9]+)?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_SECRET_REF = re.compile(r"[a-z0-9][-a-z0-9.]*:[-._A-Za-z0-9]+")
_CUSTOM_MODEL = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", re.ASCII)
_DIGEST = re.compile(r"[0-9a-f]{64}")
_GCS_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]*[a-z0-9]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def config_error(field_name: str, problem: str, fix: str) -> TfpipeConfigError:
    """The error for a bad value: ``"<field>: <problem>. Fix: <fix>."`` (raise it)."""
    return TfpipeConfigError(f"{field_name}: {problem}. Fix: {fix}.")


def did_you_mean(value: Any, names: Any) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``names``, or ``""``."""
    import difflib  # only for a value that is wrong

    close = difflib.get_close_matches(str(value), list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --- Checks other modules use too -------------------------------------------------------------------


def check_name(field_name: str, value: Any, *, example: str = "digits") -> None:
    """Raise unless ``value`` is a safe identifier for file and container names."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise config_error(field_name, f"must be a name of letters, digits, '.', '_' or '-', got {value!r}",
                           f"rename it, e.g. {example!r}")


def check_image_ref(field_name: str, ref: Any, *, allow_floating_tag: bool = False) -> None:
    """Raise unless ``ref`` names a pinned image: a digest, or a version tag that is not floating.

    A floating tag (``latest``, ``gpu``, ...) or no tag at all silently changes what runs (a cuDNN
    mismatch, say). Opt out with ``allow_floating_tag=True``.
    """
    if not isinstance(ref, str) or not ref.strip() or any(c.isspace() for c in ref):
        raise config_error(field_name, f"must be an image reference string, got {ref!r}",
                           "e.g. 'registry.example/tfpipe/trainer:3f2a9c1b7e4d'")
    if "@sha256:" in ref:
        if not _DIGEST.fullmatch(ref.split("@sha256:", 1)[1]):
            raise config_error(field_name, f"digest in {ref!r} is not 64 hex digits", "copy the digest from `docker inspect`")
        return
    if allow_floating_tag:
        return
    last = ref.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else None
    pin = "pin a version tag (e.g. ':2.9.3-gpu') or a digest ('@sha256:...'), or pass allow_floating_tag=True"
    if tag is None:
        raise config_error(field_name, f"image {ref!r} has no tag, so Docker uses the floating 'latest'", pin)
    if tag.lower() in FLOATING_TAGS or not any(ch.isdigit() for ch in tag):
        raise config_error(field_name, f"tag {tag!r} of {ref!r} is floating (it can point at a different image "
                           "tomorrow)", pin)


def check_host_path(field_name: str, value: Any) -> str:
    """Validate a host path for a bind mount and return it normalised.

    Refuses relative paths (they would resolve against the engine's working directory), the
    root directory and the Docker socket or its directory (mounting either hands the container
    control of the engine).
    """
    # An example named after the field, so the fix for volumes.models does not suggest a data directory.
    example = "/srv/tfpipe/" + field_name.rpartition(".")[2].removesuffix("_volume")
    if value is None or value == "":
        raise config_error(field_name, "is not set", f"give the directory on the engine's host, e.g. {example!r}")
    if not isinstance(value, str):
        raise config_error(field_name, f"must be an absolute host path, got {value!r}", f"e.g. {example!r}")
    if not value.startswith("/"):
        raise config_error(field_name, f"{value!r} is relative; a mount path is a path on the Docker engine's host",
                           f"give an absolute path such as {example!r}")
    norm = posixpath.normpath(value)
    if norm == "/":
        raise config_error(field_name, "mounting '/' exposes the whole host", "mount a dedicated directory")
    if norm in DOCKER_SOCKETS or norm.endswith("docker.sock"):
        raise config_error(field_name, f"{norm!r} is (or holds) the Docker socket; a container with it controls "
                           "the engine", "mount a data directory instead")
    return norm


def check_relative_path(field_name: str, value: Any) -> None:
    """Raise unless ``value`` is a path relative to a mount that stays inside it."""
    if not isinstance(value, str) or not value:
        raise config_error(field_name, f"must be a path relative to the data volume, got {value!r}", "e.g. 'digits/digits.csv'")
    norm = posixpath.normpath(value)
    if value.startswith("/") or norm == ".." or norm.startswith("../"):
        raise config_error(field_name, f"{value!r} leaves the data volume",
                           "give a path relative to volumes.data, without a leading '/' or '..'")


def check_gcs_uri(field_name: str, value: Any) -> tuple[str, str]:
    """Validate a ``gs://bucket[/prefix]`` URI and return ``(bucket, prefix)``.

    Form only (no I/O): the scheme, a valid bucket name (3-63 characters of lowercase letters,
    digits, ``-``, ``_`` and ``.``; up to 222 with dots) and a prefix without empty, ``.`` or
    ``..`` segments. A trailing ``/`` is kept: it marks the prefix as a folder.
    """
    example = "e.g. 'gs://my-bucket/raw/digits'"
    if not isinstance(value, str) or not value:
        raise config_error(field_name, f"must be a gs:// URI, got {value!r}", f"write it as gs://BUCKET/PREFIX, {example}")
    if not value.startswith("gs://"):
        raise config_error(field_name, f"{value!r} is not a gs:// URI (only Google Cloud Storage is supported)",
                           f"write it as gs://BUCKET/PREFIX, {example}")
    if _CONTROL.search(value) or value != value.strip():
        raise config_error(field_name, f"{value!r} contains control characters or surrounding whitespace", "remove them")
    bucket, _, prefix = value[len("gs://"):].partition("/")
    if not bucket:
        raise config_error(field_name, f"{value!r} names no bucket", f"write it as gs://BUCKET/PREFIX, {example}")
    too_long = len(bucket) > 222 or ("." not in bucket and len(bucket) > 63) or any(
        len(part) > 63 for part in bucket.split("."))
    if not _GCS_BUCKET.fullmatch(bucket) or len(bucket) < 3 or too_long or ".." in bucket:
        raise config_error(field_name, f"{bucket!r} in {value!r} is not a valid bucket name (3-63 lowercase letters, "
                           "digits, '-', '_' or '.', starting and ending with a letter or digit)",
                           f"correct the bucket name, {example}")
    segments = prefix.rstrip("/").split("/") if prefix.rstrip("/") else []
    if prefix.startswith("/") or any(seg in ("", ".", "..") for seg in segments):
        raise config_error(field_name, f"the path {prefix!r} of {value!r} has an empty, '.' or '..' segment",
                           f"write the prefix as plain names separated by single '/', {example}")
    return bucket, prefix


# --- pydantic's errors in the "<field>: <problem>. Fix: <fix>." voice ---------------------------------

#: How a pattern reads in an error, for the patterns the models declare.
_PATTERN_TEXT = {contract.NAME_PATTERN: "a name of letters, digits, '.', '_' or '-'"}
_NUMBER_ERRORS = frozenset({"int_type", "int_parsing", "int_from_float", "float_type", "float_parsing",
                            "finite_number", "greater_than", "greater_than_equal", "less_than", "less_than_equal"})
_TYPE_TEXT = {"bool_type": ("must be true or false", "use a boolean"),
              "bool_parsing": ("must be true or false", "use a boolean"),
              "string_type": ("must be a string", "quote it"),
              "tuple_type": ("must be a list", "write it as a list"),
              "list_type": ("must be a list", "write it as a list"),
              "datetime_type": ("must be a date or time", "e.g. '2026-01-01'")}


def _path(where: str, loc: tuple[Any, ...]) -> str:
    text = where
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def _locate(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """The model holding the last named key of ``loc``, and that key's field (None: not a field)."""
    holder: type[BaseModel] | None = model
    owner, info = None, None
    for part in loc:
        if isinstance(part, int):
            continue
        owner, info = holder, holder.model_fields.get(part) if holder else None
        kind = info.annotation if info else None
        holder = kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None
    return owner, info


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _number_rule(info: FieldInfo | None, finite: bool) -> str:
    """``"a whole number >= 1"``, ``"a number > 0 and < 1, i.e. in (0, 1)"``: the field's type and bounds."""
    bounds = {key: getattr(rule, key) for rule in (info.metadata if info else ())
              for key in ("gt", "ge", "lt", "le") if hasattr(rule, key)}
    whole = info is not None and info.annotation is int
    text = "a whole number" if whole else "a finite number" if finite else "a number"
    parts = [f"{sign} {_num(bounds[key])}" for key, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
             if key in bounds]
    if parts:
        text += " " + " and ".join(parts)
    if len(parts) == 2:
        low, high = (_num(bounds.get(k, bounds.get(k[0] + "e"))) for k in ("gt", "lt"))
        closed = "ge" in bounds, "le" in bounds
        text += f", i.e. in {low}..{high}" if whole and all(closed) else \
            f", i.e. in {'[' if closed[0] else '('}{low}, {high}{']' if closed[1] else ')'}"
    return text


def _translated(err: ValidationError, model: type[BaseModel], where: str) -> TfpipeConfigError:
    """The first error of ``err`` as a :class:`TfpipeConfigError`; a check's own error passes through."""
    first = err.errors(include_url=False)[0]
    ctx = first.get("ctx") or {}
    if isinstance(ctx.get("error"), TfpipeConfigError):
        return ctx["error"]
    loc, kind, value = first["loc"], first["type"], first.get("input")
    path = _path(where, loc)
    owner, info = _locate(model, loc)
    example = f", e.g. {info.examples[0]!r}" if info and info.examples else ""
    if kind == "extra_forbidden":
        import difflib  # only for a key that is wrong

        names = list(owner.model_fields) if owner else []
        close = difflib.get_close_matches(str(loc[-1]), names, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(names)}"
        return config_error(path, "unknown key", f"remove it ({hint})")
    if kind == "missing":
        return config_error(path, "is missing", f"add {loc[-1]} to {_path(where, loc[:-1]) or 'the pipeline config'}"
                            f"{example}")
    if kind == "literal_error":
        return config_error(path, f"unknown value {value!r}", f"use one of {ctx['expected']}")
    if kind == "string_pattern_mismatch":
        wanted = _PATTERN_TEXT.get(ctx["pattern"], f"text matching {ctx['pattern']}")
        return config_error(path, f"must be {wanted}, got {value!r}", f"rename it{example or ', e.g. ' + repr('digits')}")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return config_error(path, f"must be a mapping, got {type(value).__name__}", f"write {path} as key: value pairs")
    plausible = contract.SECTIONS.get(getattr(owner, "section", ""), {}).get(str(loc[-1]), {}).get("parse_maximum")
    if kind == "less_than_equal" and plausible is not None:
        return config_error(path, f"{value!r} is above {plausible}, not a plausible {loc[-1]}: it must be "
                            f"{_number_rule(info, False)}", f"use at most {plausible}")
    if kind in _NUMBER_ERRORS:
        default = info.default if info is not None and isinstance(info.default, (int, float)) else None
        return config_error(path, f"must be {_number_rule(info, kind == 'finite_number')}, got {value!r}",
                            f"e.g. {default!r}" if default is not None else "give a number in that range")
    problem, fix = _TYPE_TEXT.get(kind, (first["msg"][:1].lower() + first["msg"][1:], f"see {path} in the "
                                         "configuration reference"))
    return config_error(path, f"{problem}, got {value!r}", fix + example if kind == "string_type" else fix)


# --- The models -------------------------------------------------------------------------------------

Name = Annotated[str, Field(strict=True, pattern=contract.NAME_PATTERN)]
Whole = Annotated[int, Field(strict=True)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Flag = Annotated[bool, Field(strict=True)]


class _Section(BaseModel):
    """Base of every config model: frozen, unknown keys refused, errors as :class:`TfpipeConfigError`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    #: The key of this section in a pipeline config, and the prefix of its errors' field names.
    section: ClassVar[str] = ""

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise _translated(err, type(self), self.section) from None

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any] | None, *, where: str | None = None) -> Any:
        """Build from a plain mapping (``None``: every default), rejecting unknown keys with a did-you-mean."""
        where = cls.section if where is None else where
        if mapping is None:
            mapping = {}
        if isinstance(mapping, cls):
            return mapping
        if not isinstance(mapping, Mapping):
            raise config_error(where or "pipeline", f"must be a mapping, got {type(mapping).__name__}",
                               f"write {where or 'the pipeline config'} as key: value pairs")
        try:
            return cls.model_validate(dict(mapping))
        except ValidationError as err:
            raise _translated(err, cls, where) from None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able copy (tuples become lists)."""
        return self.model_dump(mode="json")


def json_ready(value: Any) -> Any:
    """Convert models, tuples and mappings recursively into JSON-native dicts and lists."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


_KINDS: dict[str, Any] = {"int": Whole, "number": Number, "bool": Flag, "str": Annotated[str, Field(strict=True)],
                          "str?": Optional[str], "dict": dict[str, Any], "list?": Optional[tuple]}
_BOUNDS = (("minimum", "ge"), ("exclusive_minimum", "gt"), ("maximum", "le"), ("exclusive_maximum", "lt"),
           ("parse_maximum", "le"))


def contract_fields(section: str) -> type[_Section]:
    """A model with the fields of the contract's ``section``: types, defaults, bounds, choices, docs.

    ``parse_maximum`` is a bound here: it is what a DAG's parse checks (the trainer does not).
    """
    fields: dict[str, Any] = {}
    for name, spec in contract.SECTIONS[section].items():
        bounds = {key: spec[rule] for rule, key in _BOUNDS if rule in spec}
        if spec["kind"] == "pair":  # two integers, each in the bounds
            item = Annotated[int, Field(strict=True, **bounds)]
            kind, bounds = tuple[item, item], {}
        elif "choices" in spec:
            kind = Literal[tuple(spec["choices"])]
        elif "pattern" in spec:
            kind = Annotated[str, Field(strict=True, pattern=spec["pattern"])]
        else:
            kind = _KINDS[spec["kind"]]
        default = spec["default"]
        if isinstance(default, dict):
            info = Field(default_factory=lambda value=default: dict(value), description=spec["doc"], **bounds)
        else:
            info = Field(tuple(default) if isinstance(default, list) else default, description=spec["doc"], **bounds)
        fields[name] = (kind, info)
    return create_model(f"_{section.title()}Fields", __base__=_Section, __module__=__name__, **fields)


@dataclass(frozen=True)
class GpuRequest:
    """GPUs for one container: a count (``-1`` = all) or explicit device ids."""

    count: int = 0
    device_ids: tuple[str, ...] = ()

    @classmethod
    def parse(cls, value: Any, *, field_name: str = "gpus") -> GpuRequest | None:
        """Parse ``None``, ``"all"``, a count, or a list of device ids; raise a config error otherwise."""
        if isinstance(value, str):
            value = value.strip()
            if "," in value:
                value = [v.strip() for v in value.split(",")]
        if value is None or value == 0 or value in ("", "none"):
            return None
        if value == "all":
            return cls(count=-1)
        if isinstance(value, bool):
            raise config_error(field_name, f"{value!r} is not a GPU spec", "use 'all', a count such as 2, or ['0', '1']")
        if isinstance(value, int):
            if value < 0:
                raise config_error(field_name, f"GPU count must be >= 1, got {value}", "use 'all', a count, or device ids")
            return cls(count=value)
        if isinstance(value, str) and value.isdigit():
            return cls(count=int(value))
        if isinstance(value, (list, tuple)) and value:
            ids = tuple(str(v) for v in value)
            if any(not v or not (v.isdigit() or v.startswith("GPU-") or v.startswith("MIG-")) for v in ids):
                raise config_error(field_name, f"device ids must be indexes or UUIDs, got {list(value)!r}",
                                   "e.g. ['0', '1'] or ['GPU-8a3c...']")
            if isinstance(value[0], bool):
                raise config_error(field_name, f"{value!r} is not a GPU spec", "use 'all', a count, or device ids")
            return cls(device_ids=ids)
        raise config_error(field_name, f"{value!r} is not a GPU spec", "use None, 'all', a count such as 2, or ['0', '1']")

    def to_docker(self) -> list:
        """The docker-py ``DeviceRequest`` list (engine API >= 1.40)."""
        from docker.types import DeviceRequest

        if self.device_ids:
            return [DeviceRequest(device_ids=list(self.device_ids), capabilities=[["gpu"]])]
        return [DeviceRequest(count=self.count, capabilities=[["gpu"]])]

    def describe(self) -> str:
        """Human-readable form for logs."""
        if self.device_ids:
            return "GPUs " + ",".join(self.device_ids)
        return "all GPUs" if self.count == -1 else f"{self.count} GPU(s)"


class ImageConfig(_Section):
    """The trainer image."""

    section: ClassVar[str] = "image"
    ref: Optional[str] = Field(None, examples=["registry.example/tfpipe/trainer:3f2a9c1b7e4d"], description=(
        "image reference, pinned by version tag or digest; null = the deployment's image, read from the "
        f"Airflow Variable `{IMAGE_VARIABLE}` when a task runs"))
    allow_floating_tag: Flag = Field(False, description="accept `latest` or an untagged reference (not reproducible)")

    @model_validator(mode="after")
    def _pinned(self) -> ImageConfig:
        if self.ref is not None:
            check_image_ref("image.ref", self.ref, allow_floating_tag=self.allow_floating_tag)
        return self


class VolumesConfig(_Section):
    """Host directories (on the Docker engine's host) mounted into every stage."""

    section: ClassVar[str] = "volumes"
    data: str = Field(examples=["/srv/tfpipe/data"], description="raw inputs, mounted read-only at `/data`")
    work: str = Field(examples=["/srv/tfpipe/work"],
                      description="prepared data sets, run directories and checkpoints, read-write at `/work`")
    models: str = Field(examples=["/srv/tfpipe/models"], description="exported model versions, read-write at `/models`")

    @field_validator("data", "work", "models", mode="before")
    @classmethod
    def _host_path(cls, value: Any, info: ValidationInfo) -> str:
        return check_host_path(f"volumes.{info.field_name}", value)

    @model_validator(mode="after")
    def _own_directories(self) -> VolumesConfig:
        for name in ("work", "models"):
            if getattr(self, name) == self.data:
                raise config_error(f"volumes.{name}", "is the same directory as volumes.data, which is mounted "
                                   "read-only", f"give volumes.{name} its own directory")
        return self


def _checked_classes(classes: Any) -> tuple[str, ...]:
    """``data.classes`` as a tuple of distinct names; integers become their text."""
    example = "e.g. ['cat', 'dog', 'fox'], or omit it to take the classes from the data"
    if isinstance(classes, (str, bytes)) or not isinstance(classes, (list, tuple)) or len(classes) < 2:
        raise config_error("data.classes", f"must be a list of at least two class names, got {classes!r}", example)
    names = []
    for i, name in enumerate(classes):
        if isinstance(name, int) and not isinstance(name, bool):
            name = str(name)
        if not isinstance(name, str) or not name or name != name.strip():
            raise config_error(f"data.classes[{i}]", f"must be a class name as the labels write it (text, no "
                               f"leading or trailing spaces), got {name!r}", example)
        names.append(name)
    seen: set[str] = set()
    twice = sorted({name for name in names if name in seen or seen.add(name)})
    if twice:
        raise config_error("data.classes", f"names {', '.join(map(repr, twice))} more than once",
                           "list each class once: its position is its class id")
    return tuple(names)


def _checked_features(features: Any) -> tuple[dict[str, str], ...]:
    """``data.features`` as ``{"name", "type"}`` mappings; a bare name is a float column."""
    if not isinstance(features, (list, tuple)) or not features:
        raise config_error("data.features", "must be a non-empty list or None", "list the feature columns or omit it")
    cleaned = []
    for i, feat in enumerate(features):
        feat = {"name": feat, "type": "float"} if isinstance(feat, str) else feat
        if not isinstance(feat, Mapping) or set(feat) - {"name", "type"} or not isinstance(feat.get("name"), str):
            raise config_error(f"data.features[{i}]", f"must be a column name or {{name, type}}, got {feat!r}",
                               "e.g. {'name': 'age', 'type': 'float'}")
        kind = feat.get("type", "float")
        if kind not in contract.FEATURE_TYPES:
            raise config_error(f"data.features[{i}].type", f"unknown value {kind!r}",
                               f"use one of {', '.join(map(repr, contract.FEATURE_TYPES))}")
        cleaned.append({"name": feat["name"], "type": kind})
    return tuple(cleaned)


def _checked_columns(columns: Mapping[Any, Any]) -> dict[str, str]:
    """``data.columns`` as ``{column name: type}``, every type one of :data:`contract.COLUMN_TYPES`."""
    choices = ", ".join(map(repr, contract.COLUMN_TYPES))
    for name, kind in columns.items():
        if not isinstance(name, str) or not name.strip():
            raise config_error("data.columns", f"keys must be column names as the CSV header writes them, got {name!r}",
                               "e.g. {'zip': 'categorical'}")
        if kind not in contract.COLUMN_TYPES:
            raise config_error(f"data.columns.{name}", f"unknown type {kind!r}",
                               f"use one of {choices}{did_you_mean(str(kind).lower(), contract.COLUMN_TYPES)}")
    return dict(columns)


class DataConfig(contract_fields("data")):
    """Where the raw data is and how prep reads and splits it."""

    section: ClassVar[str] = "data"

    @field_validator("classes", mode="before")
    @classmethod
    def _classes(cls, value: Any) -> Any:
        return None if value is None else _checked_classes(value)

    @field_validator("features", mode="before")
    @classmethod
    def _features(cls, value: Any) -> Any:
        return None if value is None else _checked_features(value)

    @field_validator("columns", mode="before")
    @classmethod
    def _columns(cls, value: Any) -> Any:
        return _checked_columns(value) if isinstance(value, Mapping) else value  # not a mapping: the generic error

    @field_validator("na_values", mode="before")
    @classmethod
    def _na_values(cls, value: Any) -> Any:
        for i, text in enumerate(value if isinstance(value, (list, tuple)) else ()):
            if not isinstance(text, str):
                raise config_error(f"data.na_values[{i}]", f"must be a cell text, got {text!r}",
                                   f"quote it, e.g. {str(text)!r}, or write null for only empty cells")
        return value

    @field_validator("image_size", mode="before")
    @classmethod
    def _image_size(cls, size: Any) -> Any:
        spec = contract.SECTIONS["data"]["image_size"]
        low, high = spec["minimum"], spec["maximum"]
        if (not isinstance(size, (list, tuple)) or len(size) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in size)):
            raise config_error("data.image_size", f"must be [height, width] with {low}..{high} each, got {size!r}",
                               "e.g. [64, 64]")
        return tuple(size)

    @field_validator("label")
    @classmethod
    def _label(cls, label: str) -> str:
        if not label:
            raise config_error("data.label", f"must name the label column, got {label!r}", "e.g. label='label'")
        return label

    @field_validator("key")
    @classmethod
    def _key(cls, key: str | None) -> str | None:
        if key == "":
            raise config_error("data.key", "must be a column name or None, got ''", "omit it to split by row content")
        return key

    @model_validator(mode="after")
    def _path_and_shards(self) -> DataConfig:
        check_relative_path("data.path", self.path)  # the contract's default (None) must be replaced
        for name in sorted(self.columns):
            if name in (self.label, self.key):  # prep reads them as the label or split key, never as a feature
                role = "label" if name == self.label else "key"
                raise config_error(f"data.columns.{name}", f"is the {role} column (data.{role}), which is not a "
                                   "feature and has no type", "remove it from data.columns")
        if self.columns and self.format not in contract.TABULAR_FORMATS:
            raise config_error("data.columns", f"types table columns, data.format is {self.format!r}",
                               "remove data.columns for image folders")
        if self.shards > 1 and self.format not in contract.TABULAR_FORMATS:
            raise config_error("data.shards", f"sharded prep reads CSV and Parquet tables, data.format is "
                               f"{self.format!r}", "set data.shards to 1 (one prep task reads image folders)")
        if self.window_days and self.format not in contract.TABULAR_FORMATS:
            raise config_error("data.window_days", f"date windows read CSV or Parquet partitions, data.format is "
                               f"{self.format!r}",
                               "set data.window_days to 0 for image folders")
        if self.min_partitions > self.window_days:
            raise config_error("data.min_partitions", f"{self.min_partitions} is above data.window_days "
                               f"{self.window_days}: the window never holds that many partitions",
                               f"set it to at most {self.window_days} (0: every day of the window)")
        return self


class TrainingConfig(contract_fields("training")):
    """Model and hyperparameters."""

    section: ClassVar[str] = "training"
    #: Fields a run may override (``dag_run.conf``; the trigger form's Params for most of them).
    TUNABLE: ClassVar[tuple[str, ...]] = tuple(
        name for name, section in contract.overridable().items() if section == "training")

    @field_validator("model")
    @classmethod
    def _model(cls, model: str) -> str:
        if model not in contract.BUILTIN_MODELS and not _CUSTOM_MODEL.fullmatch(model):
            raise config_error("training.model", f"unknown model {model!r}",
                               f"use one of {', '.join(contract.BUILTIN_MODELS)} or 'package.module:function' "
                               "with code_path")
        return model

    @field_validator("code_path")
    @classmethod
    def _code_path(cls, path: str | None) -> str | None:
        if path is not None and not path.startswith("/"):
            check_relative_path("training.code_path", path)
        return path

    @model_validator(mode="after")
    def _consistent(self) -> TrainingConfig:
        if ":" in self.model and not self.code_path:
            raise config_error("training.code_path", f"custom model {self.model!r} needs code_path",
                               "set code_path to the container directory that holds the package")
        warmup = self.learning_rate_warmup_epochs
        if warmup and warmup >= self.epochs:
            raise config_error("training.learning_rate_warmup_epochs", f"{warmup} warm-up epoch(s) leave none of the "
                               f"{self.epochs} epoch(s) to train at the learning rate", "make it fewer than training.epochs")
        return self


def _checked_slices(slices: Any) -> Any:
    """``evaluation.slices``: column names, or ``{column, buckets}`` with ascending numeric edges."""
    if slices is None:
        return None
    if isinstance(slices, (str, Mapping)) or not isinstance(slices, (list, tuple)):
        raise config_error("evaluation.slices", f"must be a list of columns, got {slices!r}",
                           "e.g. ['plan', {'column': 'tenure', 'buckets': [12, 24]}]")
    for i, item in enumerate(slices):
        field_name = f"evaluation.slices[{i}]"
        if isinstance(item, str) and item:
            continue
        if not isinstance(item, Mapping):
            raise config_error(field_name, f"must be a column name or {{column, buckets}}, got {item!r}",
                               "name a text or yes/no column, or give a numeric column with its bucket edges")
        unknown = sorted(set(item) - {"column", "buckets"})
        if unknown:
            raise config_error(f"{field_name}.{unknown[0]}", "unknown key", "use column and buckets")
        if not isinstance(item.get("column"), str) or not item.get("column"):
            raise config_error(f"{field_name}.column", f"must be a column name, got {item.get('column')!r}",
                               "name the numeric column the buckets cut")
        edges = item.get("buckets")
        if (not isinstance(edges, (list, tuple)) or not edges
                or any(isinstance(e, bool) or not isinstance(e, (int, float)) for e in edges)
                or any(b <= a for a, b in zip(edges, edges[1:]))):
            raise config_error(f"{field_name}.buckets", f"must be ascending numbers, got {edges!r}",
                               "give the bucket edges in ascending order, e.g. [12, 24, 48]")
    return tuple(item if isinstance(item, str) else {"column": item["column"], "buckets": list(item["buckets"])}
                 for item in slices)


class EvaluationConfig(contract_fields("evaluation")):
    """The blessing gate: what a candidate must score to be exported."""

    section: ClassVar[str] = "evaluation"

    @field_validator("slices", mode="before")
    @classmethod
    def _slices(cls, value: Any) -> Any:
        return _checked_slices(value)


def _checked_column_checks(columns: Mapping[Any, Any]) -> dict[str, dict[str, Any]]:
    """``validation.columns`` as ``{column name: {check: value}}``, each check one of
    :data:`contract.COLUMN_CHECKS`: a drift or missing-rate threshold in [0, 1], or ``skip``."""
    for name, checks in columns.items():
        field_name = f"validation.columns.{name}"
        if not isinstance(name, str) or not name:
            raise config_error("validation.columns", f"keys must be column names, got {name!r}",
                               "name the column as the table's header writes it")
        if not isinstance(checks, Mapping):
            raise config_error(field_name, f"must be a mapping of checks, got {checks!r}",
                               "e.g. {'numeric_drift': 0.3} or {'skip': true}")
        for check, value in checks.items():
            if check not in contract.COLUMN_CHECKS:
                raise config_error(f"{field_name}.{check}", f"unknown check{did_you_mean(check, contract.COLUMN_CHECKS)}",
                                   f"use one of {', '.join(contract.COLUMN_CHECKS)}")
            if check == "skip":
                if not isinstance(value, bool):
                    raise config_error(f"{field_name}.skip", f"must be true or false, got {value!r}",
                                       "write skip: true to leave the column out of the drift checks")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise config_error(f"{field_name}.{check}", f"must be a number from 0 to 1, got {value!r}",
                                   f"give the largest {check} this column may show")
    return {name: dict(checks) for name, checks in columns.items()}


class ValidationConfig(contract_fields("validation")):
    """The data gate: how far tonight's data may differ from the production model's before the run stops."""

    section: ClassVar[str] = "validation"

    @field_validator("columns", mode="before")
    @classmethod
    def _columns(cls, value: Any) -> Any:
        return _checked_column_checks(value) if isinstance(value, Mapping) else value


class ExportConfig(contract_fields("export")):
    """Versioned SavedModel export."""

    section: ClassVar[str] = "export"


# --- Sweeps -----------------------------------------------------------------------------------------

#: Training settings a search space may name (besides ``model_kwargs.<name>``): every setting of one
#: training run; ``model_kwargs`` is tuned key by key, and the code's location is not a setting.
SWEEPABLE = tuple(name for name in contract.SECTIONS["training"] if name not in ("model_kwargs", "code_path"))
_KWARG = "model_kwargs."


def _checked_dimension(key: Any, values: Any) -> Any:
    """One entry of ``tuning.space``: a setting, and a list of values or a ``{low, high[, log]}`` range."""
    field_name = f"tuning.space.{key}"
    if not isinstance(key, str) or not (key in SWEEPABLE or (key.startswith(_KWARG) and key != _KWARG)):
        raise config_error(field_name, f"unknown training setting{did_you_mean(key, SWEEPABLE)}",
                           "name a training setting such as learning_rate, or model_kwargs.<name> for an argument "
                           "of the model builder")
    kind = contract.SECTIONS["training"].get(key, {}).get("kind")
    if isinstance(values, (list, tuple)):
        if not values:
            raise config_error(field_name, "is an empty list", "list the values to try, e.g. [0.001, 0.01]")
        return list(values)
    if not isinstance(values, Mapping):
        raise config_error(field_name, f"must be a list of values or a range, got {values!r}",
                           "e.g. [32, 64] or {low: 0.0001, high: 0.1, log: true}")
    unknown = sorted(set(values) - {"low", "high", "log"})
    if unknown:
        raise config_error(f"{field_name}.{unknown[0]}", "unknown key", "a range has low, high and log")
    low, high, log = values.get("low"), values.get("high"), values.get("log", False)
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in (low, high)) or not low < high:
        raise config_error(field_name, f"a range needs numbers low < high, got low={low!r} high={high!r}",
                           "e.g. {low: 0.0001, high: 0.1}")
    if kind not in (None, "int", "number"):
        raise config_error(field_name, f"{key} is not a number, so it has no range", "list its values instead")
    if kind == "int" and not (isinstance(low, int) and isinstance(high, int)):
        raise config_error(field_name, f"{key} is a whole number, so low and high must be whole numbers",
                           f"e.g. {{low: {int(low)}, high: {int(high) + 1}}}")
    if not isinstance(log, bool) or (log and low <= 0):
        raise config_error(f"{field_name}.log", "a log range needs log: true or false and low above 0",
                           "set low above 0, or log: false")
    return {"low": low, "high": high, "log": log}


def _draw(rng: Any, values: Any) -> Any:
    """One value of a space entry: a listed value, or a number of the range (4 significant digits)."""
    import math

    if isinstance(values, list):
        return rng.choice(values)
    low, high = values["low"], values["high"]
    if values["log"]:
        value = math.exp(rng.uniform(math.log(low), math.log(high)))
    else:
        value = rng.uniform(low, high)
    if isinstance(low, int) and isinstance(high, int):
        return min(high, max(low, int(round(value))))
    return float(f"{value:.4g}")


def trial_training(training: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """The training section of one trial: ``training`` with the trial's settings (``model_kwargs.<name>``
    into ``model_kwargs``), checked as a training section is."""
    merged = dict(training)
    merged["model_kwargs"] = dict(merged.get("model_kwargs") or {})
    for key, value in params.items():
        if key.startswith(_KWARG):
            merged["model_kwargs"][key[len(_KWARG):]] = value
        else:
            merged[key] = value
    return TrainingConfig.from_dict(merged).to_dict()


class TuningConfig(contract_fields("tuning")):
    """A sweep: the settings to try, how they are searched, and what picks the best trial."""

    section: ClassVar[str] = "tuning"

    @field_validator("space", mode="before")
    @classmethod
    def _space(cls, space: Any) -> Any:
        if not isinstance(space, Mapping):
            return space  # the field's type check names it
        return {key: _checked_dimension(key, values) for key, values in space.items()}

    @model_validator(mode="after")
    def _grid(self) -> TuningConfig:
        if self.search != "grid":
            return self
        ranges = [key for key, values in self.space.items() if not isinstance(values, list)]
        if ranges:
            raise config_error(f"tuning.space.{ranges[0]}", "a grid search takes lists of values, not ranges",
                               "list the values, or use search: random")
        import math

        combinations = math.prod(len(values) for values in self.space.values())
        limit = contract.SECTIONS["tuning"]["trials"]["parse_maximum"]
        if combinations > limit:
            raise config_error("tuning.space", f"the grid has {combinations} combinations, above {limit}",
                               "list fewer values, or use search: random with tuning.trials")
        return self

    @property
    def enabled(self) -> bool:
        """Whether the pipeline sweeps (a search space is set)."""
        return bool(self.space)

    def trial_plan(self) -> list[dict[str, Any]]:
        """Every trial, ``{"index": k, "params": {setting: value}}``: the grid's combinations in the order the
        space lists them, or ``trials`` seeded random draws; ``[]`` without a space."""
        if not self.space:
            return []
        keys = list(self.space)
        if self.search == "grid":
            import itertools

            combos = itertools.product(*(self.space[key] for key in keys))
        else:
            import random

            rng = random.Random(self.seed)
            combos = ([_draw(rng, self.space[key]) for key in keys] for _ in range(self.trials))
        return [{"index": k, "params": dict(zip(keys, values))} for k, values in enumerate(combos)]


#: The stage-config sections, by name (the contract's sections, as models).
STAGE_SECTIONS: dict[str, type[_Section]] = {
    "data": DataConfig, "training": TrainingConfig, "validation": ValidationConfig, "evaluation": EvaluationConfig,
    "tuning": TuningConfig, "export": ExportConfig,
}


class RetentionConfig(_Section):
    """What the ``cleanup`` task keeps on the work volume after every run (see :mod:`tfpipe.operators.retention`).

    Run dirs (checkpoints, TensorBoard events, reports) are kept for the ``keep_runs`` most recently
    active runs, every run that produced a model version still kept, runs Airflow holds as queued or
    running, and anything written within ``min_idle_minutes``; data sets for the runs kept, plus the
    newest.
    """

    section: ClassVar[str] = "retention"
    enabled: Flag = Field(True, description="add the `cleanup` task (false: nothing is ever removed from the work volume)")
    keep_runs: Whole = Field(10, ge=1, description="how many of the most recently active run dirs to keep")
    min_idle_minutes: Number = Field(60.0, ge=0, description=(
        "never remove a run dir or data set written to (or reused) this recently; 0 only where no other run "
        "can share the volume"))


_TOLERATION_KEYS = {"key": "key", "operator": "operator", "value": "value", "effect": "effect",
                    "toleration_seconds": "toleration_seconds", "tolerationSeconds": "toleration_seconds"}
_TOLERATION_CHOICES = {"operator": ("Equal", "Exists"), "effect": ("", "NoSchedule", "PreferNoSchedule", "NoExecute")}


def _checked_tolerations(value: Any) -> tuple[dict[str, Any], ...]:
    """Kubernetes tolerations with snake_case keys, as a tuple."""
    example = "e.g. [{'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoSchedule'}]"
    if not isinstance(value, (list, tuple)):
        raise config_error("resources.tolerations", f"must be a list of tolerations, got {value!r}", example)
    cleaned = []
    for i, item in enumerate(value):
        where = f"resources.tolerations[{i}]"
        if not isinstance(item, Mapping) or set(item) - set(_TOLERATION_KEYS):
            raise config_error(where, f"must be a mapping of {', '.join(sorted(_TOLERATION_KEYS))}, got {item!r}",
                               example)
        toleration = {_TOLERATION_KEYS[k]: v for k, v in item.items()}
        for key, choices in _TOLERATION_CHOICES.items():
            if toleration.get(key, choices[0]) not in choices:
                raise config_error(f"{where}.{key}", f"unknown value {toleration[key]!r}",
                                   f"use one of {', '.join(map(repr, choices))}")
        seconds = toleration.get("toleration_seconds")
        if seconds is not None and not (isinstance(seconds, int) and not isinstance(seconds, bool) and seconds >= 0):
            raise config_error(f"{where}.toleration_seconds", f"must be a whole number >= 0, got {seconds!r}",
                               "e.g. 300, or leave it out")
        cleaned.append(toleration)
    return tuple(cleaned)


def _checked_environment(field_name: str, env: Any) -> dict[str, str]:
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and _ENV_NAME.fullmatch(k) and isinstance(v, str)
                                               for k, v in env.items()):
        raise config_error(field_name, "must map variable names to string values", "e.g. {'WANDB_MODE': 'offline'}")
    return dict(env)


class ResourcesConfig(_Section):
    """Container resources and isolation."""

    section: ClassVar[str] = "resources"
    gpus: Any = Field(None, description="null (CPU), `all`, a count, or a list of device ids (`['0', '1']`)")
    gpu_fallback: Literal["fail", "cpu"] = Field("fail", description=(
        "when GPUs are asked for but the engine has no NVIDIA runtime: `fail` with a message naming the fix, "
        "or `cpu` to run on the CPU"))
    gpu_stages: tuple[Literal[contract.STAGES], ...] = Field(
        ("train", "evaluate"), description="stages that get the GPUs")
    mem_limit: Optional[str] = Field(None, examples=["8g"], description="container memory limit; null = no limit")
    shm_size: str = Field("1g", description="`/dev/shm` size; tf.data worker threads need more than Docker's 64 MB")
    user: str = Field("1000:1000", description=(
        "`uid:gid` the stages run as (non-root, so mounted files belong to the user)"))
    network_mode: str = Field("bridge", description="Docker network (`none` isolates training from the network)")
    environment: dict[str, str] = Field(default_factory=dict, description="extra environment variables of every "
                                        "stage container")
    private_environment: dict[str, str] = Field(default_factory=dict, repr=False, description=(
        "secret environment variables (tokens, keys): passed to the containers only, never rendered in the UI, "
        "logged or stored in XCom; prefer reading them from a secrets backend in the DAG file"))
    node_selector: dict[str, str] = Field(default_factory=dict, description=(
        "Kubernetes backend: node labels a stage pod must match (e.g. `{'nvidia.com/gpu.present': 'true'}`); "
        "the Docker backend ignores it"))
    tolerations: tuple[dict[str, Any], ...] = Field((), description=(
        "Kubernetes backend: tolerations of the stage pods, as in a pod spec "
        "(`{'key': 'nvidia.com/gpu', 'operator': 'Exists', 'effect': 'NoSchedule'}`)"))
    cpus: Optional[float] = Field(None, ge=0.01, le=1024, description=(
        "CPU limit of each stage container (Docker `--cpus`; on Kubernetes the pod's `cpu` limit, 1.5 as 1500m), "
        "so one run cannot starve others on a shared host; null = no limit"))
    timezone: str = Field("UTC", description=(
        "IANA time zone of the stage containers (`TZ`), so container log times match the host's"))
    jemalloc: Flag = Field(True, description=(
        "run the stages with jemalloc in place of glibc malloc (the image preloads it), which keeps the memory "
        "of long training runs from creeping up"))

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, gpus: Any) -> Any:
        GpuRequest.parse(gpus, field_name="resources.gpus")
        return gpus

    @field_validator("mem_limit", "shm_size", mode="before")
    @classmethod
    def _size(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and not (isinstance(value, str) and _SIZE.fullmatch(value)):
            raise config_error(f"resources.{info.field_name}", f"must be a size like '2g' or '512m', got {value!r}",
                               "e.g. '2g'")
        return value

    @field_validator("user", mode="before")
    @classmethod
    def _user(cls, user: Any) -> Any:
        if not isinstance(user, str) or not _USER.fullmatch(user):
            raise config_error("resources.user", f"must be 'uid:gid' in numbers, got {user!r}", "e.g. '1000:1000'")
        return user

    @field_validator("network_mode", mode="before")
    @classmethod
    def _network_mode(cls, mode: Any) -> Any:
        if not isinstance(mode, str) or not mode:
            raise config_error("resources.network_mode", f"must be a Docker network name, got {mode!r}",
                               "e.g. 'bridge' or 'none'")
        if mode == "host":
            raise config_error("resources.network_mode", "'host' shares the host's network stack", "use 'bridge' or 'none'")
        return mode

    @field_validator("environment", "private_environment", mode="before")
    @classmethod
    def _environment(cls, env: Any, info: ValidationInfo) -> dict[str, str]:
        return _checked_environment(f"resources.{info.field_name}", env)

    @field_validator("node_selector", mode="before")
    @classmethod
    def _node_selector(cls, labels: Any) -> dict[str, str]:
        if not isinstance(labels, Mapping) or not all(isinstance(k, str) and k and isinstance(v, str)
                                                      for k, v in labels.items()):
            raise config_error("resources.node_selector", "must map node label names to string values",
                               "e.g. {'nvidia.com/gpu.present': 'true'}")
        return dict(labels)

    @field_validator("tolerations", mode="before")
    @classmethod
    def _tolerations(cls, value: Any) -> tuple[dict[str, Any], ...]:
        return _checked_tolerations(value)

    @field_validator("cpus", mode="before")
    @classmethod
    def _cpus(cls, cpus: Any) -> Any:
        if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, float))
                                 or not 0.01 <= cpus <= 1024):
            raise config_error("resources.cpus", f"must be a number of CPUs in [0.01, 1024] or None, got {cpus!r}",
                               "e.g. 4 or 1.5 (Docker's --cpus), or None for no limit")
        return cpus

    @field_validator("timezone", mode="before")
    @classmethod
    def _timezone(cls, name: Any) -> Any:
        import zoneinfo

        try:
            zoneinfo.ZoneInfo(name)
        except (TypeError, ValueError, zoneinfo.ZoneInfoNotFoundError):
            raise config_error("resources.timezone", f"unknown time zone {name!r}",
                               "use an IANA name such as 'UTC', 'Europe/Berlin' or 'Asia/Shanghai'") from None
        return name


class KubernetesConfig(_Section):
    """Where the stages run when ``backend="kubernetes"`` (``pip install 'airflow-provider-tfpipe[kubernetes]'``)."""

    section: ClassVar[str] = "kubernetes"
    namespace: str = Field("default", description="the namespace of the stage pods")
    kubernetes_conn_id: Optional[str] = Field("kubernetes_default", description=(
        "the Airflow Kubernetes connection (null: in-cluster or kube config)"))
    in_cluster: Optional[Flag] = Field(None, description="use the in-cluster service account configuration")
    config_file: Optional[str] = Field(None, description="a kube config file on the worker")
    claims: dict[str, str] = Field(default_factory=dict, description=(
        "PersistentVolumeClaim per volume (`{'data': 'raw', 'work': 'work', 'models': 'models'}`); a volume "
        "without a claim is a hostPath of `volumes.<name>` on the node"))
    service_account_name: Optional[str] = Field(None, description="the pods' service account")
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = Field(
        "IfNotPresent", description="when the node pulls the trainer image")
    prepare_volumes: Flag = Field(True, description=(
        "run an init container (root, only `chown` of the directories the stage writes) before each stage, as "
        "the Docker backend's helper container does; turn it off where volumes are already owned by "
        "`resources.user` (e.g. fsGroup-managed PVCs)"))
    secret_env: dict[str, str] = Field(default_factory=dict, description=(
        "environment variables from Kubernetes Secrets, `{'VAR': 'secret-name:key'}` (the Kubernetes "
        "backend's `private_environment`)"))

    @field_validator("namespace", mode="before")
    @classmethod
    def _namespace(cls, namespace: Any) -> Any:
        if not isinstance(namespace, str) or not _K8S_NAME.fullmatch(namespace) or len(namespace) > 63:
            raise config_error("kubernetes.namespace", f"must be a Kubernetes namespace name, got {namespace!r}",
                               "use lowercase letters, digits and '-', e.g. 'ml-training'")
        return namespace

    @field_validator("claims", mode="before")
    @classmethod
    def _claims(cls, claims: Any) -> dict[str, str]:
        if not isinstance(claims, Mapping) or set(claims) - {"data", "work", "models"} or not all(
                isinstance(v, str) and _K8S_NAME.fullmatch(v) for v in claims.values()):
            raise config_error("kubernetes.claims", f"must map data/work/models to PVC names, got {claims!r}",
                               "e.g. {'work': 'tfpipe-work', 'models': 'tfpipe-models'}")
        return dict(claims)

    @field_validator("secret_env", mode="before")
    @classmethod
    def _secret_env(cls, env: Any) -> dict[str, str]:
        if not isinstance(env, Mapping) or not all(
                isinstance(k, str) and _ENV_NAME.fullmatch(k) and isinstance(v, str) and _SECRET_REF.fullmatch(v)
                for k, v in env.items()):
            raise config_error("kubernetes.secret_env", f"must map variable names to 'secret-name:key', got {env!r}",
                               "e.g. {'WANDB_API_KEY': 'wandb:api-key'}")
        return dict(env)


def _checked_schedule(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise config_error("schedule", f"must be a cron expression, a preset like '@daily', or None, got {value!r}",
                           "e.g. '0 3 * * *'")
    if value.startswith("@"):
        if value not in CRON_PRESETS:
            raise config_error("schedule", f"unknown preset {value!r}", f"use one of {', '.join(sorted(CRON_PRESETS))}")
        return value
    from croniter import croniter  # Airflow's own cron parser, which it installs

    if len(value.split()) != 5 or not croniter.is_valid(value):
        raise config_error("schedule", f"{value!r} is not a valid 5-field cron expression",
                           "use minute hour day-of-month month day-of-week, e.g. '0 3 * * *'")
    return value


class MlflowConfig(_Section):
    """MLflow tracking and registry of every run (``pip install 'airflow-provider-tfpipe[mlflow]'``; see
    :mod:`tfpipe.operators.register`): the ``register`` task logs the run and registers a blessed export
    when the Airflow connection ``conn_id`` exists, and skips itself when it does not."""

    section: ClassVar[str] = "mlflow"
    enabled: Flag = Field(True, description=(
        "add the `register` task (Docker backend only: it reads the run's files through the engine)"))
    conn_id: Name = Field("mlflow_default", description=(
        "Airflow connection whose host is the tracking URI, e.g. `http://127.0.0.1:5000`; missing: `register` skips"))


def _checked_tags(tags: Any) -> tuple[str, ...]:
    """``tags`` as a tuple of non-empty strings; a bare string is refused, not split into letters."""
    if isinstance(tags, str) or not isinstance(tags, (list, tuple, set, frozenset)):
        raise config_error("tags", f"must be a list of tag strings, got {tags!r}", "e.g. ['tfpipe', 'digits']")
    for tag in tags:
        if not isinstance(tag, str) or not tag.strip() or len(tag) > TAG_MAX_LEN:
            raise config_error("tags", f"every tag must be a non-empty string of at most {TAG_MAX_LEN} characters, "
                               f"got {tag!r}", "e.g. ['tfpipe', 'digits']")
    return tuple(sorted(tags)) if isinstance(tags, (set, frozenset)) else tuple(tags)  # a stable order


def _checked_start_date(value: Any) -> datetime | None:
    """``start_date`` as a datetime: one as given, a date at midnight, or an ISO 8601 string (a mapping
    loaded from YAML or JSON has those); naive ones keep Airflow's default time zone, as a DAG's do."""
    if value is None or isinstance(value, datetime):
        return value
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    fix = "give a datetime, e.g. datetime(2026, 1, 1, tzinfo=timezone.utc), or an ISO 8601 string such as '2026-01-01'"
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.strip())
        except ValueError:
            raise config_error("start_date", f"{value!r} is not an ISO 8601 date or time", fix) from None
    raise config_error("start_date", f"must be a date or time, got {value!r}", fix)


def _checked_engine_url(field_name: str, url: Any) -> str:
    if not isinstance(url, str) or "://" not in url:
        raise config_error(field_name, f"must be a URL like 'unix://var/run/docker.sock' or 'tcp://host:2376', got "
                           f"{url!r}", "set the engine's URL")
    return url


class PipelineConfig(_Section):
    """A whole training pipeline: prep -> validate -> train -> evaluate -> export."""

    dag_id: Name = Field(examples=["digits"], description="the DAG's id")
    image: ImageConfig = Field(description="the trainer image")
    volumes: VolumesConfig = Field(description="host directories mounted into every stage")
    data: DataConfig = Field(description="raw data and its split")
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="model and hyperparameters")
    validation: ValidationConfig = Field(default_factory=ValidationConfig, description=(
        "the data gate: tonight's data against the production model's, before training"))
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig, description="the blessing gate")
    export: ExportConfig = Field(default_factory=ExportConfig, description="model name and versions kept")
    tuning: TuningConfig = Field(default_factory=TuningConfig, description=(
        "a sweep: train as one mapped task per trial, then `select` the best trial for the blessing gate"))
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig, description="GPUs, memory, user, network")
    retention: RetentionConfig = Field(default_factory=RetentionConfig,
                                       description="what the cleanup task keeps on the work volume")
    schedule: Optional[str] = Field(None, description=(
        "cron expression or preset (`@daily`); null = manual only (unless `data_asset`)"))
    data_asset: Optional[str] = Field(None, description="URI of an Airflow Asset whose updates trigger retraining")
    model_asset: Optional[str] = Field(None, description=(
        "URI of the Asset that export emits; null = `tfpipe://models/<model_name>`"))
    retries: Whole = Field(3, ge=0, le=20, description="retries of the training task (the other stages get one)")
    retry_delay_seconds: Number = Field(30.0, ge=0, description="first retry delay; doubles with each try")
    gpu_pool: Optional[Name] = Field(None, examples=["gpu"], description=(
        "Airflow pool of the training task, e.g. `gpu` to let one training job at a time use the GPUs; null = "
        "Airflow's default pool. Create it first (`airflow pools set gpu 1 \"GPU slots\"`): a task in a pool "
        "that does not exist is never scheduled"))
    docker_url: str = Field("unix://var/run/docker.sock", description="the Docker engine (may be remote)")
    shard_docker_urls: tuple[str, ...] = Field((), description=(
        "the Docker engines the `prep_shard` tasks spread over (`data.shards` > 1), shard k on entry k % len; "
        "empty = every shard on `docker_url`. Every engine must mount the same `volumes` at the same paths "
        "and have the image or be able to pull it; a `tcp://` entry gets the deployment's TLS client files"))
    start_date: Optional[datetime] = Field(datetime(2026, 1, 1, tzinfo=timezone.utc), description=(
        "first schedulable date: a datetime (naive: Airflow's default time zone), a date, or an ISO 8601 string "
        "such as `2026-01-01`; null = Airflow's default"))
    tags: tuple[str, ...] = Field(("tfpipe",), description=(
        "DAG tags, a list of strings (a bare string is refused rather than split into letters)"))
    description: str = Field("TensorFlow training pipeline: prep -> validate -> train -> evaluate -> export",
                             description="one-line DAG description (null: none)")
    data_uri: Optional[str] = Field(None, description=(
        "default `gs://bucket/prefix` synced to `volumes.data`/`data.path` before prep (a run's `data_uri` Param "
        "overrides it); null = no stage-in"))
    publish_uri: Optional[str] = Field(None, description=(
        "default `gs://bucket/prefix` blessed exports are published under, as `<prefix>/<model_name>/<version>/` "
        "(a run's `publish_uri` Param overrides it); null = no publish"))
    gcp_conn_id: str = Field("google_cloud_default", description=(
        "Airflow connection with the Google credentials (missing: Application Default Credentials; with "
        "`STORAGE_EMULATOR_HOST` set: anonymous)"))
    gcs_tasks: Flag = Field(False, description=(
        "give the DAG both Cloud Storage tasks (`stage_in`, `publish`) and their run Params even where "
        "`data_uri`/`publish_uri` are not set, so each run can name its buckets"))
    backend: Literal["docker", "kubernetes"] = Field("docker", description=(
        "`docker` (DockerOperators against `docker_url`) or `kubernetes` (KubernetesPodOperators, see the "
        "`kubernetes` section); the stages are the same specs"))
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig,
                                         description="namespace, claims and connection of the Kubernetes backend")
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig,
                                 description="MLflow tracking and model registry (the `register` task)")

    @field_validator("image", "volumes", "data", "training", "validation", "evaluation", "export", "tuning", "resources",
                     "retention", "kubernetes", "mlflow", mode="before")
    @classmethod
    def _empty_section(cls, value: Any) -> Any:
        return {} if value is None else value  # a YAML key with nothing under it: every default

    @field_validator("schedule", mode="before")
    @classmethod
    def _schedule(cls, value: Any) -> Any:
        return _checked_schedule(value)

    @field_validator("data_asset", "model_asset", mode="before")
    @classmethod
    def _asset(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and (not isinstance(value, str) or "://" not in value):
            raise config_error(info.field_name, f"must be an asset URI like 'file:///srv/raw/digits', got {value!r}",
                               "give a URI with a scheme")
        return value

    @field_validator("docker_url", mode="before")
    @classmethod
    def _docker_url(cls, url: Any) -> Any:
        return _checked_engine_url("docker_url", url)

    @field_validator("shard_docker_urls", mode="before")
    @classmethod
    def _shard_docker_urls(cls, urls: Any) -> tuple[str, ...]:
        if isinstance(urls, str) or not isinstance(urls, (list, tuple)):
            raise config_error("shard_docker_urls", f"must be a list of engine URLs, got {urls!r}",
                               "e.g. ['tcp://gpu-1:2376', 'tcp://gpu-2:2376']")
        return tuple(_checked_engine_url(f"shard_docker_urls[{i}]", url) for i, url in enumerate(urls))

    @field_validator("start_date", mode="before")
    @classmethod
    def _start_date(cls, value: Any) -> Any:
        return _checked_start_date(value)

    @field_validator("tags", mode="before")
    @classmethod
    def _tags(cls, tags: Any) -> tuple[str, ...]:
        return _checked_tags(tags)

    @field_validator("description", mode="before")
    @classmethod
    def _description(cls, text: Any) -> Any:
        return "" if text is None else text  # as Airflow's DAG takes it: no description

    @field_validator("data_uri", "publish_uri")
    @classmethod
    def _gcs_uri(cls, uri: str | None, info: ValidationInfo) -> str | None:
        if uri is not None:
            check_gcs_uri(info.field_name, uri)
        return uri

    @field_validator("gcp_conn_id")
    @classmethod
    def _gcp_conn_id(cls, conn_id: str) -> str:
        if not conn_id.strip():
            raise config_error("gcp_conn_id", f"must name an Airflow connection, got {conn_id!r}",
                               "e.g. 'google_cloud_default'")
        return conn_id

    @model_validator(mode="after")
    def _consistent(self) -> PipelineConfig:
        if self.data.format == "images" and self.training.model == "mlp":
            raise config_error("training.model", "'mlp' is for tables (csv or parquet), data.format is 'images'",
                               "use 'cnn' or 'resnet50'")
        if self.data.format in contract.TABULAR_FORMATS and self.training.model in ("cnn", "resnet50"):
            raise config_error("training.model", f"{self.training.model!r} needs images, data.format is "
                               f"{self.data.format!r}", "use 'mlp'")
        if self.backend == "kubernetes":
            self._check_kubernetes()
        urls = self.shard_docker_urls
        if urls and self.data.shards == 1:
            raise config_error("shard_docker_urls", "data.shards is 1, so there are no prep_shard tasks to spread over "
                               "engines", "set data.shards to 2 or more, or leave shard_docker_urls empty")
        if urls and self.data.shards < len(urls):
            raise config_error("shard_docker_urls", f"lists {len(urls)} engines but data.shards is {self.data.shards}, "
                               "so some engines would get no shard",
                               f"set data.shards to {len(urls)} or more, or list fewer engines")
        self._check_trials()
        return self

    def _check_trials(self) -> None:
        """A sweep value, or a trial, that cannot train fails the parse rather than the run: each listed value
        and range end on its own, then each trial's combination (a warm-up as long as its epochs)."""
        training = self.training.to_dict()
        for key, values in self.tuning.space.items():
            for value in values if isinstance(values, list) else (values["low"], values["high"]):
                try:
                    trial_training(training, {key: value})
                except TfpipeConfigError as err:
                    raise TfpipeConfigError(f"tuning.space.{key}: the value {value!r} cannot train: {err}") from None
        for trial in self.tuning.trial_plan():
            try:
                trial_training(training, trial["params"])
            except TfpipeConfigError as err:
                settings = ", ".join(f"{key}={value!r}" for key, value in trial["params"].items())
                raise TfpipeConfigError(f"tuning.space: trial {trial['index']} ({settings}) cannot train: {err}") from None

    def _check_kubernetes(self) -> None:
        """What the Kubernetes backend cannot do, said at parse time."""
        gpus = GpuRequest.parse(self.resources.gpus, field_name="resources.gpus")
        if gpus and (gpus.count == -1 or gpus.device_ids):
            raise config_error("resources.gpus", f"{self.resources.gpus!r} cannot be asked of Kubernetes, which "
                               "schedules GPUs by count (nvidia.com/gpu)", "give a count such as 1 or 2")
        if self.shard_docker_urls:
            raise config_error("shard_docker_urls", "Docker engines cannot be chosen with the Kubernetes backend",
                               "leave shard_docker_urls empty with backend='kubernetes'")
        if self.tuning.enabled:
            raise config_error("tuning.space", "sweeps need the Docker backend: the Kubernetes backend has no "
                               "mapped trial pods or select pod", "leave tuning.space empty with backend='kubernetes'")
        if self.data.shards > 1:
            raise config_error("data.shards", f"{self.data.shards} needs the Docker backend: the Kubernetes backend "
                               "has no prep_shard and prep_merge pods", "set data.shards to 1 with backend='kubernetes'")
        for name in ("data_uri", "publish_uri", "gcs_tasks"):
            if getattr(self, name) not in (None, False):
                raise config_error(name, "Cloud Storage stage-in and publish run through a Docker engine's helper "
                                   "containers, which the Kubernetes backend has not",
                                   "leave it unset with backend='kubernetes' (or use backend='docker')")

    def shard_engine(self, index: int) -> str:
        """The Docker engine that ``prep_shard`` task ``index`` runs on."""
        urls = self.shard_docker_urls
        return urls[index % len(urls)] if urls else self.docker_url

    @property
    def model_asset_uri(self) -> str:
        """The URI of the model asset export emits."""
        return self.model_asset or f"tfpipe://models/{self.export.model_name}"
