"""Pipeline configuration: frozen dataclasses, one per concern, validated when constructed.

Everything here runs at DAG-parse time, so it does no I/O: it checks shapes, types and ranges
and raises :class:`TfpipeConfigError` with a message that names the field
and says how to fix it. Paths are paths **on the Docker engine's host** (the engine may not be
the worker's host), so they are checked for form only, never for existence.

Build a config from keyword arguments, or from a plain mapping (YAML/JSON) with
:meth:`PipelineConfig.from_dict`, which also rejects unknown keys.

The stage-config sections (``data``, ``training``, ``evaluation``, ``export``) take every default,
bound and choice from the contract's schema (:data:`tfpipe.contract.SECTIONS`), which the trainer
reads too; this module defines none of its own for them.
"""

from __future__ import annotations

import dataclasses
import math
import posixpath
import re
from collections.abc import Mapping
from dataclasses import field
from datetime import date, datetime, timezone
from typing import Any, ClassVar

from tfpipe import contract
from tfpipe.frozen import frozen_dataclass


class TfpipeConfigError(ValueError):
    """A pipeline or operator argument is wrong; the message names the field and the fix.

    Raised at DAG-parse time, so a bad config shows up as a DAG import error in the UI
    instead of a failed run. Defined here, with the checks that raise it, rather than with the
    exceptions a running task raises (:mod:`tfpipe.exceptions`, which exports it too): those build
    on Airflow's, and a DAG file's parse, which the DAG processor repeats every few seconds,
    needs none of them.
    """


#: The Airflow Variable holding the trainer image reference of a deployment: what a pipeline runs
#: when its ``image.ref`` is left unset (read by :func:`tfpipe.settings.resolve_image` at run time).
IMAGE_VARIABLE = "tfpipe_image"

GPU_FALLBACKS = ("fail", "cpu")

#: Tags that move: an image referenced by one of these is not reproducible.
FLOATING_TAGS = frozenset({"latest", "stable", "nightly", "gpu", "latest-gpu", "devel", "devel-gpu", "edge"})
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock", "/var/run", "/run")
def _close_matches(word: str, names: Any, n: int = 1) -> list[str]:
    """``difflib.get_close_matches``, imported only when a key is wrong (never for a good config)."""
    import difflib

    return difflib.get_close_matches(word, names, n=n)


# Patterns stay strings: ``re`` compiles (and caches) each on first use, so a DAG file pays
# only for the checks its config needs.
_NAME = contract.NAME_PATTERN
_MEM = r"^\d+(\.\d+)?[bkmgBKMG]?$"
_CUSTOM_MODEL = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
_USER = r"\d+(:\d+)?"  # re.fullmatch

# The checks every config runs (names, sizes, the user, the Kubernetes namespace, the cron fields)
# are plain string tests instead of their patterns above: compiling a pattern costs about 0.2 ms,
# each parse of a DAG file pays it again, and those few patterns were a third of what tfpipe's own
# modules add to a parse. Each function answers as its pattern does under ``re.fullmatch`` with
# ``re.ASCII``: ASCII digits only (a Unicode digit in a size or a uid means nothing to Docker), and
# no trailing newline (``re.match``'s ``$`` would let one into a file or container name). A test
# compares them on every short string over the characters that matter.
_DIGITS = frozenset("0123456789")
_NAME_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") | _DIGITS
_NAME_CHARS = _NAME_FIRST | frozenset("._-")
_K8S_ENDS = frozenset("abcdefghijklmnopqrstuvwxyz") | _DIGITS
_K8S_CHARS = _K8S_ENDS | frozenset("-.")


def _number(text: str) -> bool:
    return bool(text) and _DIGITS.issuperset(text)


def matches_name(value: str) -> bool:
    """``contract.NAME_PATTERN`` in full: a letter or digit, then letters, digits, ``.``, ``_``, ``-``."""
    return bool(value) and value[0] in _NAME_FIRST and _NAME_CHARS.issuperset(value)


def matches_size(value: str) -> bool:
    """``_MEM`` in full: a size such as ``2g``, ``512m`` or ``1.5G``."""
    if value[-1:] in ("b", "k", "m", "g", "B", "K", "M", "G"):
        value = value[:-1]
    whole, dot, fraction = value.partition(".")
    return _number(whole) and (not dot or _number(fraction))


def matches_user(value: str) -> bool:
    """``_USER`` in full: ``uid`` or ``uid:gid`` in numbers."""
    uid, colon, gid = value.partition(":")
    return _number(uid) and (not colon or _number(gid))


def matches_k8s_name(value: str) -> bool:
    """``_K8S_NAME`` in full: lowercase letters, digits, ``-`` and ``.``, a letter or digit at each end."""
    return (bool(value) and value[0] in _K8S_ENDS and value[-1] in _K8S_ENDS
            and _K8S_CHARS.issuperset(value))


def cron_item_groups(item: str) -> tuple[str | None, str | None, str | None] | None:
    """``_CRON_ITEM``'s number groups (first, last, step) in full, or None when it does not match."""
    head, slash, step = item.partition("/")
    if slash and not _number(step):
        return None
    if head == "*":
        return None, None, step if slash else None
    first, dash, last = head.partition("-")
    if not _number(first) or (dash and not _number(last)):
        return None
    return first, last if dash else None, step if slash else None


def config_error(field_name: str, problem: str, fix: str) -> TfpipeConfigError:
    """The error for a bad value: ``"<field>: <problem>. Fix: <fix>."`` (raise it)."""
    return TfpipeConfigError(f"{field_name}: {problem}. Fix: {fix}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_positive_int(field_name: str, value: Any) -> None:
    """Raise unless ``value`` is an integer >= 1."""
    if not _is_int(value) or value < 1:
        raise config_error(field_name, f"must be a whole number >= 1, got {value!r}", f"set {field_name} to 1 or more")


def check_choice(field_name: str, value: Any, choices: tuple[str, ...]) -> None:
    """Raise unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise config_error(field_name, f"unknown value {value!r}", f"use one of {', '.join(map(repr, choices))}")


def check_name(field_name: str, value: Any, *, example: str = "digits") -> None:
    """Raise unless ``value`` is a safe identifier for file and container names."""
    if not isinstance(value, str) or not matches_name(value):
        raise config_error(
            field_name,
            f"must be a name of letters, digits, '.', '_' or '-', got {value!r}",
            f"rename it, e.g. {example!r}",
        )


def check_image_ref(field_name: str, ref: Any, *, allow_floating_tag: bool = False) -> None:
    """Raise unless ``ref`` names a pinned image: a digest, or a version tag that is not floating.

    A floating tag (``latest``, ``gpu``, ...) or no tag at all silently changes what runs; the
    seeds this project grew from trace cuDNN mismatches to exactly that. Opt out with
    ``allow_floating_tag=True``.
    """
    if not isinstance(ref, str) or not ref.strip() or any(c.isspace() for c in ref):
        raise config_error(field_name, f"must be an image reference string, got {ref!r}",
                           "e.g. 'registry.example/tfpipe/trainer:3f2a9c1b7e4d'")
    if "@sha256:" in ref:
        digest = ref.split("@sha256:", 1)[1]
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise config_error(field_name, f"digest in {ref!r} is not 64 hex digits", "copy the digest from `docker inspect`")
        return
    if allow_floating_tag:
        return
    last = ref.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else None
    if tag is None:
        raise config_error(
            field_name,
            f"image {ref!r} has no tag, so Docker uses the floating 'latest'",
            "pin a version tag (e.g. ':2.9.3-gpu') or a digest ('@sha256:...'), "
            "or pass allow_floating_tag=True",
        )
    if tag.lower() in FLOATING_TAGS or not any(ch.isdigit() for ch in tag):
        raise config_error(
            field_name,
            f"tag {tag!r} of {ref!r} is floating (it can point at a different image tomorrow)",
            "pin a version tag (e.g. ':2.9.3-gpu') or a digest ('@sha256:...'), "
            "or pass allow_floating_tag=True",
        )


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
        raise config_error(
            field_name,
            f"{value!r} is relative; a mount path is a path on the Docker engine's host",
            f"give an absolute path such as {example!r}",
        )
    norm = posixpath.normpath(value)
    if norm == "/":
        raise config_error(field_name, "mounting '/' exposes the whole host", "mount a dedicated directory")
    if norm in DOCKER_SOCKETS or norm.endswith("docker.sock"):
        raise config_error(
            field_name,
            f"{norm!r} is (or holds) the Docker socket; a container with it controls the engine",
            "mount a data directory instead",
        )
    return norm


def check_relative_path(field_name: str, value: Any) -> None:
    """Raise unless ``value`` is a path relative to a mount that stays inside it."""
    if not isinstance(value, str) or not value:
        raise config_error(field_name, f"must be a path relative to the data volume, got {value!r}", "e.g. 'digits/digits.csv'")
    norm = posixpath.normpath(value)
    if value.startswith("/") or norm == ".." or norm.startswith("../"):
        raise config_error(
            field_name,
            f"{value!r} leaves the data volume",
            "give a path relative to volumes.data, without a leading '/' or '..'",
        )


# --- Google Cloud Storage URIs --------------------------------------------------------------------

_GCS_BUCKET = r"^[a-z0-9][a-z0-9._-]*[a-z0-9]$"
_CONTROL = r"[\x00-\x1f\x7f]"


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
    if re.search(_CONTROL, value) or value != value.strip():
        raise config_error(field_name, f"{value!r} contains control characters or surrounding whitespace",
                    "remove them")
    bucket, _, prefix = value[len("gs://"):].partition("/")
    if not bucket:
        raise config_error(field_name, f"{value!r} names no bucket", f"write it as gs://BUCKET/PREFIX, {example}")
    too_long = len(bucket) > 222 or ("." not in bucket and len(bucket) > 63) or any(
        len(part) > 63 for part in bucket.split("."))
    if not re.match(_GCS_BUCKET, bucket) or len(bucket) < 3 or too_long or ".." in bucket:
        raise config_error(field_name, f"{bucket!r} in {value!r} is not a valid bucket name (3-63 lowercase letters, "
                    "digits, '-', '_' or '.', starting and ending with a letter or digit)",
                    f"correct the bucket name, {example}")
    segments = prefix.rstrip("/").split("/") if prefix.rstrip("/") else []
    if prefix.startswith("/") or any(seg in ("", ".", "..") for seg in segments):
        raise config_error(field_name, f"the path {prefix!r} of {value!r} has an empty, '.' or '..' segment",
                    f"write the prefix as plain names separated by single '/', {example}")
    return bucket, prefix


def schema_default(section: str, name: str) -> Any:
    """A dataclass default for a stage-config field, from the contract (lists become tuples)."""
    value = contract.SECTIONS[section][name]["default"]
    if isinstance(value, dict):
        return field(default_factory=lambda: dict(value))
    if isinstance(value, list):
        return tuple(value)
    return value


def _interval(spec: Mapping[str, Any]) -> tuple[Any, Any, bool, bool]:
    """``(low, high, low_open, high_open)`` of a schema field; ``parse_maximum`` counts as high."""
    low_open, high_open = "exclusive_minimum" in spec, "exclusive_maximum" in spec
    low = spec.get("exclusive_minimum", spec.get("minimum"))
    high = spec.get("exclusive_maximum", spec.get("maximum", spec.get("parse_maximum")))
    return low, high, low_open, high_open


def check_schema_field(section: str, name: str, value: Any) -> None:
    """Check one stage-config field against the contract: kind, choices, pattern and bounds.

    Bounds include ``parse_maximum`` (plausibility, checked at parse time and in the trigger form).
    """
    spec = contract.SECTIONS[section][name]
    where, kind = f"{section}.{name}", spec["kind"]
    if "choices" in spec:
        check_choice(where, value, tuple(spec["choices"]))
        return
    if "pattern" in spec:
        check_name(where, value)
        return
    if kind == "bool":
        if not isinstance(value, bool):
            raise config_error(where, f"must be true or false, got {value!r}", "use a boolean")
        return
    low, high, low_open, high_open = _interval(spec)
    if kind == "int":
        if not _is_int(value) or (low is not None and value < low):
            if low is None:
                raise config_error(where, f"must be an integer, got {value!r}", f"e.g. {spec['default']}")
            raise config_error(where, f"must be a whole number >= {low}, got {value!r}", f"set {where} to {low} or more")
        if high is not None and value > high:
            raise config_error(where, f"{value} is above {high}, not a plausible {name}", f"use at most {high}")
    elif kind == "number":
        ok = _is_number(value) and math.isfinite(value)
        ok = ok and (low is None or (value > low if low_open else value >= low))
        ok = ok and (high is None or (value < high if high_open else value <= high))
        if not ok:
            bounds = []
            if low is not None:
                bounds.append(f"{'>' if low_open else '>='} {low:g}")
            if high is not None:
                bounds.append(f"{'<' if high_open else '<='} {high:g}")
            text = f"must be a finite number {' and '.join(bounds)}".rstrip()
            if low is not None and high is not None:
                text += f", i.e. in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            raise config_error(where, f"{text}, got {value!r}", f"e.g. {spec['default']}")


def check_schema_section(section: str, obj: Any) -> None:
    """:func:`check_schema_field` on every field of ``section`` with a rule of its kind."""
    for name, spec in contract.SECTIONS[section].items():
        if spec["kind"] in ("int", "number", "bool") or "choices" in spec or "pattern" in spec:
            check_schema_field(section, name, getattr(obj, name))


@frozen_dataclass
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


@frozen_dataclass
class _Section:
    """Base of every config section: strict construction from mappings."""

    section: ClassVar[str] = ""

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any] | None, *, where: str | None = None):
        """Build from a plain mapping, rejecting unknown keys with a did-you-mean hint."""
        where = where or cls.section
        if mapping is None:
            return cls()
        if isinstance(mapping, cls):
            return mapping
        if not isinstance(mapping, Mapping):
            raise config_error(where, f"must be a mapping, got {type(mapping).__name__}", f"write {where} as key: value pairs")
        names = [f.name for f in dataclasses.fields(cls)]
        for key in mapping:
            if key not in names:
                close = _close_matches(str(key), names, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(names)}"
                raise config_error(f"{where}.{key}", "unknown key", f"remove it ({hint})")
        try:
            return cls(**dict(mapping))
        except TypeError as err:  # a required field is missing
            raise config_error(where, str(err), f"give every required key of {where}") from None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able copy (tuples become lists), as ``json_ready(dataclasses.asdict(self))``."""
        return json_ready(self)


#: Types :func:`json_ready` returns as they are (their subclasses take the general path).
_JSON_LEAVES = frozenset((str, int, float, bool, type(None)))


def json_ready(value: Any) -> Any:
    """Convert dataclass instances, tuples and mappings recursively into JSON-native dicts and lists.

    A dataclass instance becomes the dict of its fields, as in ``dataclasses.asdict``, without the
    deep copy ``asdict`` makes of every value first: every container here is copied anyway, and
    what is left is immutable. A DAG file makes one such dict per stage section and stage.
    """
    kind = type(value)
    if kind in _JSON_LEAVES:
        # Most values are these; ``isinstance(value, Mapping)`` on them is an ABC check, which
        # after any ``register()`` anywhere walks Mapping's subclasses again.
        return value
    if hasattr(kind, "__dataclass_fields__"):
        return {f.name: json_ready(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if kind is tuple or kind is list:
        return [json_ready(v) for v in value]
    if kind is dict or isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


@frozen_dataclass
class ImageConfig(_Section):
    """The trainer image.

    :param ref: image reference, pinned by version tag or digest; ``None`` (the default) = the
        deployment's image, read from the Airflow Variable ``tfpipe_image`` when a task runs
        (see :mod:`tfpipe.settings`).
    :param allow_floating_tag: accept ``latest`` or an untagged reference (not reproducible).
    """

    section: ClassVar[str] = "image"
    ref: str | None = None
    allow_floating_tag: bool = False

    def __post_init__(self) -> None:
        if self.ref is not None:
            check_image_ref("image.ref", self.ref, allow_floating_tag=self.allow_floating_tag)


@frozen_dataclass
class VolumesConfig(_Section):
    """Host directories (on the Docker engine's host) mounted into every stage.

    :param data: raw inputs, mounted read-only at ``/data``.
    :param work: prepared datasets, run directories and checkpoints, read-write at ``/work``.
    :param models: exported model versions, read-write at ``/models``.
    """

    section: ClassVar[str] = "volumes"
    data: str = ""
    work: str = ""
    models: str = ""

    def __post_init__(self) -> None:
        paths = {}
        for name in ("data", "work", "models"):
            norm = check_host_path(f"volumes.{name}", getattr(self, name))
            object.__setattr__(self, name, norm)
            paths[name] = norm
        for a, b in (("work", "data"), ("models", "data")):
            if paths[a] == paths[b]:
                raise config_error(
                    f"volumes.{a}",
                    f"is the same directory as volumes.{b}, which is mounted read-only",
                    f"give volumes.{a} its own directory",
                )


def _checked_classes(classes: Any) -> tuple[str, ...]:
    """``data.classes`` as a tuple of distinct names; integers become their text."""
    example = "e.g. ['cat', 'dog', 'fox'], or omit it to take the classes from the data"
    if isinstance(classes, (str, bytes)) or not isinstance(classes, (list, tuple)) or len(classes) < 2:
        raise config_error("data.classes", f"must be a list of at least two class names, got {classes!r}", example)
    names = []
    for i, name in enumerate(classes):
        if _is_int(name):
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


@frozen_dataclass
class DataConfig(_Section):
    """Where the raw data is and how prep reads and splits it.

    Defaults, bounds and choices: :data:`tfpipe.contract.SECTIONS` ``["data"]``.

    :param path: file or directory relative to ``volumes.data``.
    :param format: ``csv`` (tabular) or ``images`` (one sub-folder per class).
    :param label: label column (csv).
    :param classes: class names in class-id order, each as the labels (or the image sub-folders)
        write it; ``None`` = from the data (class ids ``0..max``, else the sorted names). Declared,
        a class's id stays the same when a night's data lacks it, a label outside the list fails
        prep naming its line, and sharded prep accepts label names. Integers are taken as their
        text (``[0, 1]`` is ``["0", "1"]``).
    :param features: feature columns as ``{"name", "type"}`` mappings; ``None`` = every other column, float.
    :param key: column that identifies an example for the split; ``None`` = the row content.
    :param image_size: ``(height, width)`` images are resized to.
    :param channels: 1 (grayscale) or 3 (RGB).
    :param eval_fraction: share of examples held out for evaluation.
    :param split_seed: salt of the split hash (change it to draw another split).
    :param shard_size: examples per TFRecord shard.
    :param shards: prep tasks: 1 (one ``prep`` task) or N > 1 (csv only): N mapped ``prep_shard``
        tasks, each over a contiguous slice of the sorted input files, then ``prep_merge``.
    """

    section: ClassVar[str] = "data"
    path: str | None = schema_default("data", "path")
    format: str = schema_default("data", "format")
    label: str = schema_default("data", "label")
    classes: tuple | None = schema_default("data", "classes")
    features: tuple | None = schema_default("data", "features")
    key: str | None = schema_default("data", "key")
    image_size: tuple = schema_default("data", "image_size")
    channels: int = schema_default("data", "channels")
    eval_fraction: float = schema_default("data", "eval_fraction")
    split_seed: int = schema_default("data", "split_seed")
    shard_size: int = schema_default("data", "shard_size")
    shards: int = schema_default("data", "shards")

    def __post_init__(self) -> None:
        check_relative_path("data.path", self.path)
        check_schema_field("data", "format", self.format)
        if not isinstance(self.label, str) or not self.label:
            raise config_error("data.label", f"must name the label column, got {self.label!r}", "e.g. label='label'")
        if self.classes is not None:
            object.__setattr__(self, "classes", _checked_classes(self.classes))
        if self.features is not None:
            if not isinstance(self.features, (list, tuple)) or not self.features:
                raise config_error("data.features", "must be a non-empty list or None", "list the feature columns or omit it")
            cleaned = []
            for i, feat in enumerate(self.features):
                feat = {"name": feat, "type": "float"} if isinstance(feat, str) else feat
                if not isinstance(feat, Mapping) or set(feat) - {"name", "type"} or not isinstance(feat.get("name"), str):
                    raise config_error(f"data.features[{i}]", f"must be a column name or {{name, type}}, got {feat!r}",
                                       "e.g. {'name': 'age', 'type': 'float'}")
                check_choice(f"data.features[{i}].type", feat.get("type", "float"), contract.FEATURE_TYPES)
                cleaned.append({"name": feat["name"], "type": feat.get("type", "float")})
            object.__setattr__(self, "features", tuple(cleaned))
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise config_error("data.key", f"must be a column name or None, got {self.key!r}", "omit it to split by row content")
        size, spec = self.image_size, contract.SECTIONS["data"]["image_size"]
        low, high = spec["minimum"], spec["maximum"]
        if (not isinstance(size, (list, tuple)) or len(size) != 2
                or not all(_is_int(v) and low <= v <= high for v in size)):
            raise config_error("data.image_size", f"must be [height, width] with {low}..{high} each, got {size!r}",
                               "e.g. [64, 64]")
        object.__setattr__(self, "image_size", tuple(size))
        check_schema_section("data", self)
        if self.shards > 1 and self.format != "csv":
            raise config_error("data.shards", f"sharded prep reads CSV files, data.format is {self.format!r}",
                               "set data.shards to 1 for image folders")


@frozen_dataclass
class TrainingConfig(_Section):
    """Model and hyperparameters; the fields a run may override are the contract's ``override`` ones.

    Defaults, bounds and choices: :data:`tfpipe.contract.SECTIONS` ``["training"]``.

    :param model: ``mlp``, ``cnn``, ``resnet50`` or ``package.module:function`` on ``code_path``.
    :param model_kwargs: extra keyword arguments for the model builder.
    :param code_path: directory added to ``sys.path`` for a custom model: relative to the data
        volume (``"code"`` = ``/data/code``) or an absolute container path.
    :param epochs: target number of epochs (training resumes *until* it).
    :param batch_size: global batch size.
    :param learning_rate: optimizer learning rate.
    :param optimizer: ``adam``, ``sgd`` or ``rmsprop``.
    :param learning_rate_schedule: ``constant``, or ``cosine``: from ``learning_rate`` down to 0 at
        the run's last step (``epochs`` x steps per epoch; a resumed try continues the same curve).
    :param learning_rate_warmup_epochs: the first this many epochs ramp the rate linearly up to
        ``learning_rate`` (step ``k`` of ``W`` at ``(k + 1) / W`` of it), then the schedule follows
        (a cosine spans the steps after the warm-up); 0: none. Fewer than ``epochs``.
    :param seed: seed of initialisation and shuffling.
    :param checkpoint_every_steps: also checkpoint every N steps (epoch ends always checkpoint;
        0 = epoch ends only).
    :param keep_checkpoints: how many checkpoints to keep.
    :param steps_per_loop: training steps per compiled call in the trainer (0: automatic, about
        0.5 s of training per call); a call still ends at every checkpoint step and epoch end.
    :param mixed_precision: train in ``mixed_float16`` (GPUs with tensor cores).
    :param cache: where parsed examples are kept between epochs: ``auto`` (memory when they fit
        the container's memory budget, else a file on the work volume), ``memory``, ``file`` or
        ``none``.
    :param shuffle_buffer: shuffle buffer size in examples.
    :param warm_start: a new run initialises from the newest blessed model.
    :param early_stopping_patience: stop once ``early_stopping_monitor`` has not improved for this
        many epochs; the final weights are then those of the best epoch, whether or not training
        stopped early (0: off, every epoch runs and the last one's weights are final).
    :param early_stopping_monitor: ``val_loss`` (lower is better) or ``val_accuracy`` (higher).
    :param early_stopping_min_delta: smallest change of the monitored figure that counts as an
        improvement.
    :param gradient_clip_norm: clip each step's gradients to this global norm (over all weights and
        the whole batch, after the GPUs' gradients are summed; Keras' ``global_clipnorm``); 0: off.
    :param class_weight: ``none``, or ``balanced``: each training example's loss is weighted by the
        inverse frequency of its class in the training split (for imbalanced data; the
        evaluation is not weighted).
    """

    section: ClassVar[str] = "training"
    model: str = schema_default("training", "model")
    model_kwargs: Mapping = schema_default("training", "model_kwargs")
    code_path: str | None = schema_default("training", "code_path")
    epochs: int = schema_default("training", "epochs")
    batch_size: int = schema_default("training", "batch_size")
    learning_rate: float = schema_default("training", "learning_rate")
    optimizer: str = schema_default("training", "optimizer")
    learning_rate_schedule: str = schema_default("training", "learning_rate_schedule")
    learning_rate_warmup_epochs: int = schema_default("training", "learning_rate_warmup_epochs")
    seed: int = schema_default("training", "seed")
    checkpoint_every_steps: int = schema_default("training", "checkpoint_every_steps")
    keep_checkpoints: int = schema_default("training", "keep_checkpoints")
    steps_per_loop: int = schema_default("training", "steps_per_loop")
    mixed_precision: bool = schema_default("training", "mixed_precision")
    cache: str = schema_default("training", "cache")
    shuffle_buffer: int = schema_default("training", "shuffle_buffer")
    warm_start: bool = schema_default("training", "warm_start")
    early_stopping_patience: int = schema_default("training", "early_stopping_patience")
    early_stopping_monitor: str = schema_default("training", "early_stopping_monitor")
    early_stopping_min_delta: float = schema_default("training", "early_stopping_min_delta")
    gradient_clip_norm: float = schema_default("training", "gradient_clip_norm")
    class_weight: str = schema_default("training", "class_weight")

    def __post_init__(self) -> None:
        models = contract.BUILTIN_MODELS
        if not isinstance(self.model, str) or not (self.model in models or re.match(_CUSTOM_MODEL, self.model)):
            raise config_error(
                "training.model",
                f"unknown model {self.model!r}",
                f"use one of {', '.join(models)} or 'package.module:function' with code_path",
            )
        if ":" in self.model and not self.code_path:
            raise config_error("training.code_path", f"custom model {self.model!r} needs code_path",
                               "set code_path to the container directory that holds the package")
        if self.code_path is not None:
            if not isinstance(self.code_path, str) or not self.code_path:
                raise config_error("training.code_path", f"must be a path, got {self.code_path!r}",
                                   "give a directory relative to volumes.data (e.g. 'code') or a container path")
            if not self.code_path.startswith("/"):
                check_relative_path("training.code_path", self.code_path)
        if not isinstance(self.model_kwargs, Mapping):
            raise config_error("training.model_kwargs", "must be a mapping", "e.g. {'hidden_units': [128, 64]}")
        check_schema_section("training", self)
        if self.learning_rate_warmup_epochs and self.learning_rate_warmup_epochs >= self.epochs:
            raise config_error("training.learning_rate_warmup_epochs",
                               f"{self.learning_rate_warmup_epochs} warm-up epoch(s) leave none of the "
                               f"{self.epochs} epoch(s) to train at the learning rate",
                               "make it fewer than training.epochs")

    #: Fields a run may override (``dag_run.conf``; the trigger form's Params for most of them).
    TUNABLE: ClassVar[tuple[str, ...]] = tuple(
        name for name, spec in contract.SECTIONS["training"].items() if "override" in spec)


@frozen_dataclass
class EvaluationConfig(_Section):
    """The blessing gate.

    Defaults, bounds and choices: :data:`tfpipe.contract.SECTIONS` ``["evaluation"]``.

    :param metric: metric compared: ``accuracy``, ``macro_precision``, ``macro_recall``, ``macro_f1`` or
        ``auc`` (ROC AUC of each class against the rest, averaged; with two classes, the usual AUC).
    :param threshold: absolute minimum of the metric.
    :param tolerance: how much worse than the baseline (the newest exported version trained on the
        same classes) a candidate may be.
    """

    section: ClassVar[str] = "evaluation"
    metric: str = schema_default("evaluation", "metric")
    threshold: float = schema_default("evaluation", "threshold")
    tolerance: float = schema_default("evaluation", "tolerance")

    def __post_init__(self) -> None:
        check_schema_section("evaluation", self)


@frozen_dataclass
class ExportConfig(_Section):
    """Versioned SavedModel export.

    Defaults and bounds: :data:`tfpipe.contract.SECTIONS` ``["export"]``.

    :param model_name: directory under ``volumes.models`` (TF Serving's model name).
    :param keep_versions: how many versions to keep.
    """

    section: ClassVar[str] = "export"
    model_name: str = schema_default("export", "model_name")
    keep_versions: int = schema_default("export", "keep_versions")

    def __post_init__(self) -> None:
        check_schema_section("export", self)


#: The stage-config sections, by name (the contract's sections, as frozen dataclasses).
STAGE_SECTIONS: dict[str, type[_Section]] = {
    "data": DataConfig, "training": TrainingConfig, "evaluation": EvaluationConfig, "export": ExportConfig,
}


_TOLERATION_KEYS = {"key": "key", "operator": "operator", "value": "value", "effect": "effect",
                    "toleration_seconds": "toleration_seconds", "tolerationSeconds": "toleration_seconds"}


def _check_tolerations(value: Any) -> tuple[dict[str, Any], ...]:
    """Validate Kubernetes tolerations; return them with snake_case keys, as a tuple."""
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
        check_choice(f"{where}.operator", toleration.get("operator", "Equal"), ("Equal", "Exists"))
        check_choice(f"{where}.effect", toleration.get("effect", ""), ("", "NoSchedule", "PreferNoSchedule",
                                                                      "NoExecute"))
        seconds = toleration.get("toleration_seconds")
        if seconds is not None and not (_is_int(seconds) and seconds >= 0):
            raise config_error(f"{where}.toleration_seconds", f"must be a whole number >= 0, got {seconds!r}",
                               "e.g. 300, or leave it out")
        cleaned.append(toleration)
    return tuple(cleaned)


@frozen_dataclass
class RetentionConfig(_Section):
    """What the ``cleanup`` task keeps on the work volume after every run (see :mod:`tfpipe.operators.retention`).

    Run dirs (checkpoints, TensorBoard events, reports) are kept for the ``keep_runs`` most recently
    active runs, every run that produced a model version still kept, runs Airflow holds as queued or
    running, and anything written within ``min_idle_minutes``; data sets for the runs kept, plus the
    newest.

    :param enabled: add the ``cleanup`` task (``False``: nothing is ever removed from the work volume).
    :param keep_runs: how many of the most recently active run dirs to keep.
    :param min_idle_minutes: never remove a run dir or data set written to (or reused) this recently.
    """

    section: ClassVar[str] = "retention"
    enabled: bool = True
    keep_runs: int = 10
    min_idle_minutes: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise config_error("retention.enabled", f"must be true or false, got {self.enabled!r}", "e.g. true")
        check_positive_int("retention.keep_runs", self.keep_runs)
        if not _is_number(self.min_idle_minutes) or self.min_idle_minutes < 0:
            raise config_error("retention.min_idle_minutes", f"must be a number >= 0, got {self.min_idle_minutes!r}",
                        "e.g. 60 (0 only where no other run can share the volume)")


@frozen_dataclass
class ResourcesConfig(_Section):
    """Container resources and isolation.

    :param gpus: ``None`` (CPU), ``"all"``, a count, or a list of device ids.
    :param gpu_fallback: when GPUs are asked for but the engine has no NVIDIA runtime:
        ``"fail"`` with a message naming the fix, or ``"cpu"`` to run on the CPU.
    :param gpu_stages: stages that get the GPUs (training and evaluation by default).
    :param mem_limit: container memory limit (``"8g"``); ``None`` = no limit.
    :param shm_size: ``/dev/shm`` size; tf.data worker threads need more than Docker's 64 MB.
    :param user: ``uid:gid`` the stages run as (non-root, so mounted files belong to the user).
    :param network_mode: Docker network (``"none"`` isolates training from the network).
    :param environment: extra environment variables of every stage container.
    :param private_environment: secret environment variables (tokens, keys): passed to the
        containers only, never rendered in the UI, logged or stored in XCom. Prefer reading them
        from a secrets backend in the DAG file over writing values into it.
    :param node_selector: Kubernetes backend: node labels a stage pod must match (e.g.
        ``{"nvidia.com/gpu.present": "true"}``); the Docker backend ignores it.
    :param tolerations: Kubernetes backend: tolerations of the stage pods, as in a pod spec
        (``{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}``).
    :param cpus: CPU limit of each stage container (Docker ``--cpus``, e.g. ``4`` or ``1.5``; on
        the Kubernetes backend the pod's ``cpu`` limit, ``1.5`` as ``1500m``), so one run cannot
        starve others on a shared host; ``None`` = no limit.
    :param timezone: IANA time zone of the stage containers (``TZ``), so container log times
        match the host's, e.g. ``"Asia/Shanghai"``.
    :param jemalloc: run the stages with jemalloc in place of glibc malloc (the image preloads
        it), which keeps the memory of long training runs from creeping up; ``False`` turns it off.
    """

    section: ClassVar[str] = "resources"
    gpus: Any = None
    gpu_fallback: str = "fail"
    gpu_stages: tuple = ("train", "evaluate")
    mem_limit: str | None = None
    shm_size: str = "1g"
    user: str = "1000:1000"
    network_mode: str = "bridge"
    environment: Mapping = field(default_factory=dict)
    private_environment: Mapping = field(default_factory=dict, repr=False)
    node_selector: Mapping = field(default_factory=dict)
    tolerations: tuple = ()
    cpus: float | None = None
    timezone: str = "UTC"
    jemalloc: bool = True

    def __post_init__(self) -> None:
        self._check_cpus_timezone_jemalloc()
        for name in ("environment", "private_environment"):
            env = getattr(self, name)
            if not isinstance(env, Mapping) or not all(
                    isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and isinstance(v, str)
                    for k, v in env.items()):
                raise config_error(f"resources.{name}", "must map variable names to string values",
                            "e.g. {'WANDB_MODE': 'offline'}")

        if not isinstance(self.node_selector, Mapping) or not all(
                isinstance(k, str) and k and isinstance(v, str) for k, v in self.node_selector.items()):
            raise config_error("resources.node_selector", "must map node label names to string values",
                               "e.g. {'nvidia.com/gpu.present': 'true'}")
        object.__setattr__(self, "node_selector", dict(self.node_selector))
        object.__setattr__(self, "tolerations", _check_tolerations(self.tolerations))
        GpuRequest.parse(self.gpus, field_name="resources.gpus")
        check_choice("resources.gpu_fallback", self.gpu_fallback, GPU_FALLBACKS)
        if not isinstance(self.gpu_stages, (list, tuple)) or any(s not in contract.STAGES for s in self.gpu_stages):
            raise config_error("resources.gpu_stages", f"must list stages of {contract.STAGES}, got {self.gpu_stages!r}",
                        "e.g. ['train', 'evaluate']")
        object.__setattr__(self, "gpu_stages", tuple(self.gpu_stages))
        for name in ("mem_limit", "shm_size"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and matches_size(value)):
                raise config_error(f"resources.{name}", f"must be a size like '2g' or '512m', got {value!r}", "e.g. '2g'")
        if not isinstance(self.user, str) or not matches_user(self.user):
            raise config_error("resources.user", f"must be 'uid:gid' in numbers, got {self.user!r}", "e.g. '1000:1000'")
        if not isinstance(self.network_mode, str) or not self.network_mode:
            raise config_error("resources.network_mode", f"must be a Docker network name, got {self.network_mode!r}",
                        "e.g. 'bridge' or 'none'")
        if self.network_mode == "host":
            raise config_error("resources.network_mode", "'host' shares the host's network stack", "use 'bridge' or 'none'")

    def _check_cpus_timezone_jemalloc(self) -> None:
        import zoneinfo

        cpus = self.cpus
        if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, float))
                                 or not 0.01 <= cpus <= 1024):
            raise config_error("resources.cpus", f"must be a number of CPUs in [0.01, 1024] or None, got {cpus!r}",
                        "e.g. 4 or 1.5 (Docker's --cpus), or None for no limit")
        try:
            zoneinfo.ZoneInfo(self.timezone)
        except (TypeError, ValueError, zoneinfo.ZoneInfoNotFoundError):
            raise config_error("resources.timezone", f"unknown time zone {self.timezone!r}",
                        "use an IANA name such as 'UTC', 'Europe/Berlin' or 'Asia/Shanghai'") from None
        if not isinstance(self.jemalloc, bool):
            raise config_error("resources.jemalloc", f"must be true or false, got {self.jemalloc!r}",
                        "true (default) preloads jemalloc in the stages; false uses glibc malloc")

    @property
    def uid_gid(self) -> tuple[int, int]:
        """The numeric user and group."""
        uid, _, gid = self.user.partition(":")
        return int(uid), int(gid or uid)




BACKENDS = ("docker", "kubernetes")
_K8S_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


@frozen_dataclass
class KubernetesConfig(_Section):
    """Where the stages run when ``backend="kubernetes"`` (``pip install 'airflow-provider-tfpipe[kubernetes]'``).

    :param namespace: the namespace of the stage pods.
    :param kubernetes_conn_id: the Airflow Kubernetes connection (``None``: in-cluster or kube config).
    :param in_cluster: use the in-cluster service account configuration.
    :param config_file: a kube config file on the worker.
    :param claims: PersistentVolumeClaim per volume (``{"data": "raw", "work": "work", "models":
        "models"}``); a volume without a claim is a hostPath of ``volumes.<name>`` on the node.
    :param service_account_name: the pods' service account.
    :param image_pull_policy: ``IfNotPresent``, ``Always`` or ``Never``.
    :param prepare_volumes: run an init container (root, only ``chown`` of the directories the
        stage writes) before each stage, as the Docker backend's helper container does; turn it
        off where volumes are already owned by ``resources.user`` (e.g. ``fsGroup``-managed PVCs).
    :param secret_env: environment variables from Kubernetes Secrets, ``{"VAR": "secret-name:key"}``
        (the Kubernetes backend's ``private_environment``).
    """

    section: ClassVar[str] = "kubernetes"
    namespace: str = "default"
    kubernetes_conn_id: str | None = "kubernetes_default"
    in_cluster: bool | None = None
    config_file: str | None = None
    claims: Mapping = field(default_factory=dict)
    service_account_name: str | None = None
    image_pull_policy: str = "IfNotPresent"
    prepare_volumes: bool = True
    secret_env: Mapping = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.namespace, str) or not matches_k8s_name(self.namespace) or len(self.namespace) > 63:
            raise config_error("kubernetes.namespace", f"must be a Kubernetes namespace name, got {self.namespace!r}",
                               "use lowercase letters, digits and '-', e.g. 'ml-training'")
        if not isinstance(self.claims, Mapping) or set(self.claims) - {"data", "work", "models"} or not all(
                isinstance(v, str) and matches_k8s_name(v) for v in self.claims.values()):
            raise config_error("kubernetes.claims", f"must map data/work/models to PVC names, got {self.claims!r}",
                               "e.g. {'work': 'tfpipe-work', 'models': 'tfpipe-models'}")
        object.__setattr__(self, "claims", dict(self.claims))
        check_choice("kubernetes.image_pull_policy", self.image_pull_policy, ("IfNotPresent", "Always", "Never"))
        for name in ("in_cluster",):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise config_error(f"kubernetes.{name}", f"must be true, false or None, got {getattr(self, name)!r}",
                                   "use a boolean")
        if not isinstance(self.secret_env, Mapping) or not all(
                isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and isinstance(v, str)
                and re.fullmatch(r"[a-z0-9][-a-z0-9.]*:[-._A-Za-z0-9]+", v) for k, v in self.secret_env.items()):
            raise config_error("kubernetes.secret_env", f"must map variable names to 'secret-name:key', got "
                               f"{self.secret_env!r}", "e.g. {'WANDB_API_KEY': 'wandb:api-key'}")
        object.__setattr__(self, "secret_env", dict(self.secret_env))
        if not isinstance(self.prepare_volumes, bool):
            raise config_error("kubernetes.prepare_volumes", f"must be true or false, got {self.prepare_volumes!r}",
                               "use a boolean")


_CRON_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_CRON_ITEM = r"^(\*|(\d+)(?:-(\d+))?)(?:/(\d+))?$"


def _plain_cron_field(field_text: str, low: int, high: int) -> bool:
    """True when a cron field is only ``*``, numbers, ``a-b`` ranges and ``/n`` steps within bounds."""
    for item in field_text.split(","):
        groups = cron_item_groups(item)
        if groups is None:
            return False
        first, last, step = groups
        numbers = [int(n) for n in (first, last) if n is not None]
        if any(not low <= n <= high for n in numbers) or (len(numbers) == 2 and numbers[0] > numbers[1]):
            return False
        if step is not None and int(step) == 0:
            return False
    return True


def _check_schedule(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value.strip():
        raise config_error("schedule", f"must be a cron expression, a preset like '@daily', or None, got {value!r}",
                    "e.g. '0 3 * * *'")
    presets = {"@once", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly", "@annually",
               "@midnight", "@continuous"}
    if value.startswith("@"):
        if value not in presets:
            raise config_error("schedule", f"unknown preset {value!r}", f"use one of {', '.join(sorted(presets))}")
        return
    fields = value.split()
    if len(fields) == 5 and all(_plain_cron_field(f, lo, hi) for f, (lo, hi) in zip(fields, _CRON_BOUNDS)):
        return  # plain numbers, ranges, steps and lists in bounds: valid without importing croniter
    from croniter import croniter  # ships with Airflow; decides the rest (names, L, W, #)

    if len(fields) != 5 or not croniter.is_valid(value):
        raise config_error("schedule", f"{value!r} is not a valid 5-field cron expression",
                    "use minute hour day-of-month month day-of-week, e.g. '0 3 * * *'")


#: Airflow's limit on a DAG tag's length (longer tags fail the DAG's serialization).
TAG_MAX_LEN = 100


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


@frozen_dataclass
class PipelineConfig:
    """A whole training pipeline: prep -> train -> evaluate -> export.

    :param dag_id: the DAG's id.
    :param image: the trainer image (see :class:`ImageConfig`).
    :param volumes: host directories (see :class:`VolumesConfig`).
    :param data: raw data and split (see :class:`DataConfig`).
    :param training: model and hyperparameters (see :class:`TrainingConfig`).
    :param evaluation: blessing gate (see :class:`EvaluationConfig`).
    :param export: model name and retention (see :class:`ExportConfig`).
    :param resources: GPUs, memory, user, network (see :class:`ResourcesConfig`).
    :param retention: what the cleanup task keeps on the work volume (see :class:`RetentionConfig`).
    :param schedule: cron expression or preset; ``None`` = manual only (unless ``data_asset``).
    :param data_asset: URI of an Airflow Asset whose updates trigger retraining.
    :param model_asset: URI of the Asset that export emits; ``None`` = ``tfpipe://<model_name>``.
    :param retries: retries of the training task (the other stages get one).
    :param retry_delay_seconds: first retry delay; doubles with each try.
    :param gpu_pool: Airflow pool of the training task, e.g. ``"gpu"`` to let one training job at a
        time use the GPUs; ``None`` (the default) = Airflow's default pool. A task in a pool that
        does not exist is never scheduled, so create it first: ``airflow pools set gpu 1 "GPU slots"``.
    :param docker_url: the Docker engine (may be remote).
    :param shard_docker_urls: the Docker engines the ``prep_shard`` tasks spread over (``data.shards``
        > 1): shard k runs on entry ``k % len``; empty (the default) = every shard on ``docker_url``.
        Every engine must mount the same ``volumes`` at the same paths (one host, or a filesystem
        such as NFS mounted alike on each), since ``prep_merge`` reads all the shards' parts from
        the work volume, and must have the image or be able to pull it. An entry left at the local
        default means the deployment's engine, as ``docker_url`` does; a ``tcp://`` entry gets the
        deployment's TLS client files (``[tfpipe] tls_*``).
    :param start_date: first schedulable date: a datetime (naive: Airflow's default time zone), a date,
        or an ISO 8601 string such as ``"2026-01-01"``; ``None`` = Airflow's default.
    :param tags: DAG tags, a list of strings (a bare string is refused rather than split into letters).
    :param description: one-line DAG description (``None``: none).
    :param data_uri: default ``gs://bucket/prefix`` synced to ``volumes.data``/``data.path`` before prep
        (a run's ``data_uri`` Param overrides it); ``None`` = no stage-in.
    :param publish_uri: default ``gs://bucket/prefix`` blessed exports are published under, as
        ``<prefix>/<model_name>/<version>/`` (a run's ``publish_uri`` Param overrides it); ``None`` = no publish.
    :param gcp_conn_id: Airflow connection with the Google credentials (missing: Application Default
        Credentials; with ``STORAGE_EMULATOR_HOST`` set: anonymous).
    :param gcs_tasks: give the DAG both Cloud Storage tasks (``stage_in``, ``publish``) and their run
        Params even where ``data_uri``/``publish_uri`` are not set, so each run can name its buckets.
        Without it the DAG has ``stage_in`` only with a ``data_uri``, ``publish`` only with a
        ``publish_uri``, and neither otherwise.
    :param backend: ``"docker"`` (DockerOperators against ``docker_url``) or ``"kubernetes"``
        (KubernetesPodOperators, see :class:`KubernetesConfig`); the stages are the same specs.
    :param kubernetes: namespace, claims and connection of the Kubernetes backend.
    """

    dag_id: str
    image: ImageConfig
    volumes: VolumesConfig
    data: DataConfig
    training: TrainingConfig = field(default_factory=TrainingConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    schedule: str | None = None
    data_asset: str | None = None
    model_asset: str | None = None
    retries: int = 3
    retry_delay_seconds: float = 30.0
    gpu_pool: str | None = None
    docker_url: str = "unix://var/run/docker.sock"
    shard_docker_urls: tuple = ()
    start_date: datetime = datetime(2026, 1, 1, tzinfo=timezone.utc)
    tags: tuple = ("tfpipe",)
    description: str = "TensorFlow training pipeline: prep -> train -> evaluate -> export"
    # Google Cloud Storage
    data_uri: str | None = None
    publish_uri: str | None = None
    gcp_conn_id: str = "google_cloud_default"
    gcs_tasks: bool = False
    backend: str = "docker"
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)

    _SECTIONS: ClassVar[dict[str, type[_Section]]] = {
        "image": ImageConfig,
        "volumes": VolumesConfig,
        "data": DataConfig,
        "training": TrainingConfig,
        "evaluation": EvaluationConfig,
        "export": ExportConfig,
        "resources": ResourcesConfig,
        "retention": RetentionConfig,
        "kubernetes": KubernetesConfig,
    }

    def __post_init__(self) -> None:
        check_name("dag_id", self.dag_id)
        for name, kind in self._SECTIONS.items():
            value = getattr(self, name)
            if not isinstance(value, kind):
                object.__setattr__(self, name, kind.from_dict(value))
        _check_schedule(self.schedule)
        for name in ("data_asset", "model_asset"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or "://" not in value):
                raise config_error(name, f"must be an asset URI like 'file:///srv/raw/digits', got {value!r}",
                            "give a URI with a scheme")
        if not _is_int(self.retries) or not 0 <= self.retries <= 20:
            raise config_error("retries", f"must be a whole number in 0..20, got {self.retries!r}", "e.g. 3")
        if not _is_number(self.retry_delay_seconds) or self.retry_delay_seconds < 0:
            raise config_error("retry_delay_seconds", f"must be >= 0, got {self.retry_delay_seconds!r}", "e.g. 30")
        if self.gpu_pool is not None:
            check_name("gpu_pool", self.gpu_pool, example="gpu")
        if not isinstance(self.docker_url, str) or "://" not in self.docker_url:
            raise config_error("docker_url", f"must be a URL like 'unix://var/run/docker.sock' or 'tcp://host:2376', "
                        f"got {self.docker_url!r}", "set the engine's URL")
        if self.data.format == "images" and self.training.model == "mlp":
            raise config_error("training.model", "'mlp' is for tabular (csv) data, data.format is 'images'",
                        "use 'cnn' or 'resnet50'")
        if self.data.format == "csv" and self.training.model in ("cnn", "resnet50"):
            raise config_error("training.model", f"{self.training.model!r} needs images, data.format is 'csv'", "use 'mlp'")
        if self.description is None:  # as Airflow's DAG takes it: no description
            object.__setattr__(self, "description", "")
        if not isinstance(self.description, str):
            raise config_error("description", f"must be a string, got {self.description!r}",
                               "e.g. 'Nightly retraining of the digits classifier'")
        object.__setattr__(self, "tags", _checked_tags(self.tags))
        object.__setattr__(self, "start_date", _checked_start_date(self.start_date))
        # Google Cloud Storage
        for name in ("data_uri", "publish_uri"):
            if getattr(self, name) is not None:
                check_gcs_uri(name, getattr(self, name))
        if not isinstance(self.gcp_conn_id, str) or not self.gcp_conn_id.strip():
            raise config_error("gcp_conn_id", f"must name an Airflow connection, got {self.gcp_conn_id!r}",
                        "e.g. 'google_cloud_default'")
        if not isinstance(self.gcs_tasks, bool):
            raise config_error("gcs_tasks", f"must be true or false, got {self.gcs_tasks!r}", "e.g. true")
        check_choice("backend", self.backend, BACKENDS)
        if self.backend == "kubernetes":
            self._check_kubernetes()
        self._check_shard_engines()

    def _check_shard_engines(self) -> None:
        urls = self.shard_docker_urls
        if isinstance(urls, str) or not isinstance(urls, (list, tuple)):
            raise config_error("shard_docker_urls", f"must be a list of engine URLs, got {urls!r}",
                               "e.g. ['tcp://gpu-1:2376', 'tcp://gpu-2:2376']")
        for index, url in enumerate(urls):
            if not isinstance(url, str) or "://" not in url:
                raise config_error(f"shard_docker_urls[{index}]", "must be a URL like 'unix://var/run/docker.sock' "
                                   f"or 'tcp://host:2376', got {url!r}", "set the engine's URL")
        object.__setattr__(self, "shard_docker_urls", tuple(urls))
        if urls and self.data.shards == 1:
            raise config_error("shard_docker_urls", "data.shards is 1, so there are no prep_shard tasks to spread over "
                               "engines", "set data.shards to 2 or more, or leave shard_docker_urls empty")
        if urls and self.data.shards < len(urls):
            raise config_error("shard_docker_urls", f"lists {len(urls)} engines but data.shards is {self.data.shards}, "
                               "so some engines would get no shard",
                               f"set data.shards to {len(urls)} or more, or list fewer engines")

    def shard_engine(self, index: int) -> str:
        """The Docker engine that ``prep_shard`` task ``index`` runs on."""
        urls = self.shard_docker_urls
        return urls[index % len(urls)] if urls else self.docker_url

    def _check_kubernetes(self) -> None:
        """What the Kubernetes backend cannot do, said at parse time."""
        gpus = GpuRequest.parse(self.resources.gpus, field_name="resources.gpus")
        if gpus and (gpus.count == -1 or gpus.device_ids):
            raise config_error("resources.gpus", f"{self.resources.gpus!r} cannot be asked of Kubernetes, which "
                               "schedules GPUs by count (nvidia.com/gpu)", "give a count such as 1 or 2")
        if self.shard_docker_urls:
            raise config_error("shard_docker_urls", "Docker engines cannot be chosen with the Kubernetes backend",
                               "leave shard_docker_urls empty with backend='kubernetes'")
        if self.data.shards > 1:
            raise config_error("data.shards", f"{self.data.shards} needs the Docker backend: the Kubernetes backend "
                               "has no prep_shard and prep_merge pods", "set data.shards to 1 with backend='kubernetes'")
        for name in ("data_uri", "publish_uri", "gcs_tasks"):
            if getattr(self, name) not in (None, False):
                raise config_error(name, "Cloud Storage stage-in and publish run through a Docker engine's helper "
                                   "containers, which the Kubernetes backend has not",
                                   "leave it unset with backend='kubernetes' (or use backend='docker')")

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any]) -> PipelineConfig:
        """Build a pipeline config from a plain mapping (e.g. loaded from YAML), strictly."""
        if not isinstance(mapping, Mapping):
            raise config_error("pipeline", f"must be a mapping, got {type(mapping).__name__}", "pass a dict")
        names = [f.name for f in dataclasses.fields(cls)]
        for key in mapping:
            if key not in names:
                close = _close_matches(str(key), names, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(names)}"
                raise config_error(str(key), "unknown key", f"remove it ({hint})")
        for required in ("dag_id", "image", "volumes", "data"):
            if required not in mapping:
                raise config_error(required, "is missing", f"add {required} to the pipeline config")
        kwargs = dict(mapping)
        for name, kind in cls._SECTIONS.items():
            if name in kwargs:
                kwargs[name] = kind.from_dict(kwargs[name])
        return cls(**kwargs)

    @property
    def model_asset_uri(self) -> str:
        """The URI of the model asset export emits."""
        return self.model_asset or f"tfpipe://models/{self.export.model_name}"
