"""The contract between the Airflow side and the trainer container.

This one file is the single source of truth for both sides: the trainer imports it as
``trainer.contract`` inside the image, and the provider imports the very same file as
``tfpipe.contract`` (``provider/tfpipe/contract.py`` is a symbolic link to it). It must therefore
stay standard-library only and Python 3.8 compatible (the official TF 2.9 image runs 3.8).

Contract 1, the stage config: one JSON document per stage run, passed to the container in the
environment variable :data:`CONFIG_ENV` (never as a file on the worker: the Docker engine may be
on another host). :func:`validate_stage_config` checks its shape on both sides.

Contract 2, the exit code (:class:`ExitCode`) and the result line: a stage prints
``RESULT_PREFIX + json`` as its last result line; the operator returns that JSON through XCom.
"""

import json
import re

SCHEMA_VERSION = 1

#: Environment variable that carries the stage config JSON into the container.
CONFIG_ENV = "TFPIPE_CONFIG"

#: Prefix of the one stdout line that carries a stage's JSON result back to the operator.
RESULT_PREFIX = "TFPIPE_RESULT "

STAGES = ("prep", "train", "evaluate", "export")

#: Where the three volumes are mounted inside every stage container.
CONTAINER_DATA = "/data"
CONTAINER_WORK = "/work"
CONTAINER_MODELS = "/models"


class ExitCode:
    """Exit codes of ``python -m trainer <stage>`` and what the operator does with them.

    Any code not listed here (1 for an unexpected error, 137 for a kill, ...) is a transient
    failure that Airflow retries; training then resumes from its last checkpoint.
    """

    OK = 0
    #: evaluate: the candidate did not pass the blessing gate; export is skipped, the run succeeds.
    NOT_BLESSED = 10
    #: bad data or a bad config: retrying cannot fix it, so the task fails without retrying.
    BAD_INPUT = 11
    #: training produced a NaN or infinite loss: fails without retrying, nothing is exported.
    DIVERGED = 12

    NO_RETRY = (BAD_INPUT, DIVERGED)

    @classmethod
    def describe(cls, code):
        """A short human-readable meaning of an exit code."""
        return {
            cls.OK: "success",
            cls.NOT_BLESSED: "candidate not blessed",
            cls.BAD_INPUT: "bad input or config",
            cls.DIVERGED: "training diverged (NaN/inf loss)",
            137: "killed (SIGKILL: docker kill, or the out-of-memory killer)",
            143: "terminated (SIGTERM)",
        }.get(code, "failed")


class ContractError(ValueError):
    """A stage config does not follow the contract."""


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(value, max_len=80):
    """A filesystem- and Docker-name-safe form of ``value`` (run ids hold ':' and '+')."""
    cleaned = _SAFE.sub("_", str(value)).strip("._-") or "x"
    return cleaned[:max_len]


def run_dir(dag_id, run_id):
    """The run directory inside the container: keyed by DAG run, never by try."""
    return "%s/runs/%s/%s" % (CONTAINER_WORK, safe_name(dag_id), safe_name(run_id, 120))


_REQUIRED = {
    "schema_version": int,
    "stage": str,
    "run": dict,
    "paths": dict,
}
_RUN_KEYS = ("dag_id", "run_id", "task_id", "try_number")
_PATH_KEYS = ("data", "work", "models", "run_dir")


def validate_stage_config(config):
    """Check the shape of a stage config and return it; raise :class:`ContractError` if wrong.

    Only the envelope is checked here; each stage validates its own section with messages that
    name the field.
    """
    if not isinstance(config, dict):
        raise ContractError("stage config must be a JSON object, got %s" % type(config).__name__)
    for key, kind in _REQUIRED.items():
        if key not in config:
            raise ContractError("stage config is missing %r" % key)
        if not isinstance(config[key], kind):
            raise ContractError("stage config %r must be a %s" % (key, kind.__name__))
    if config["schema_version"] != SCHEMA_VERSION:
        raise ContractError(
            "stage config schema_version %r is not supported by this trainer (expects %d): "
            "build the trainer image from the same tfpipe version as the provider"
            % (config["schema_version"], SCHEMA_VERSION)
        )
    if config["stage"] not in STAGES:
        raise ContractError("stage %r is not one of %s" % (config["stage"], ", ".join(STAGES)))
    for key in _RUN_KEYS:
        if key not in config["run"]:
            raise ContractError("stage config run.%s is missing" % key)
    for key in _PATH_KEYS:
        if not isinstance(config["paths"].get(key), str):
            raise ContractError("stage config paths.%s is missing or not a string" % key)
    section = config.get(config["stage"], {})
    if not isinstance(section, dict):
        raise ContractError("stage config %r section must be an object" % config["stage"])
    return config


def dumps(config):
    """Serialize a stage config (stable key order, so identical configs compare equal)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def parse_result_line(lines):
    """Return the JSON result from a container's output lines (newest result line wins)."""
    for line in reversed(list(lines)):
        text = line.decode("utf-8", "replace") if isinstance(line, bytes) else str(line)
        text = text.strip()
        if text.startswith(RESULT_PREFIX):
            return json.loads(text[len(RESULT_PREFIX):])
    return None
