"""The exit-code contract between the trainer container and the operator, as one table of real exits.

Each row runs a real container of the trainer image on the engine that ends the way a stage can
end (an exit code, a kill, an out-of-memory kill) and sends it through the operator's own
run-and-map path: the operator reads the exit state from the engine and raises what Airflow acts
on. The only stand-in is the task instance, which records the XCom the evaluate stage pushes.
The trainer producing these codes for real is tested in tests/trainer and tests/integration.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from airflow.providers.common.compat.sdk import AirflowFailException, DownstreamTasksSkipped

from tfpipe import contract
from tfpipe.config import PipelineConfig
from tfpipe.exceptions import StageFailedError, StageRejectedError
from tfpipe.operators.docker import OPERATORS
from tfpipe.specs import config_template

from .test_config import GOOD

pytestmark = pytest.mark.integration

RESULT = contract.RESULT_PREFIX + '{"blessing": {"blessed": false}}'
GATE = contract.RESULT_PREFIX + '{"decision": "rejected", "anomalies": [{"column": "w", "check": "numeric_drift"}]}'


class _RecordingTI:
    def __init__(self):
        self.pushed = {}

    def xcom_push(self, key, value):
        self.pushed[key] = value


def _operator(stage: str, image: str, home, mem_limit: str | None):
    from airflow.sdk import DAG

    volumes = {name: str(home / name) for name in ("data", "work", "models")}
    for path in volumes.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    cfg = PipelineConfig.from_dict({**GOOD, "image": {"ref": image}, "volumes": volumes})
    with DAG("exit_codes", schedule=None):
        ops = {s: OPERATORS[s](task_id=s, image=image, stage_config=config_template(cfg, s), volumes=cfg.volumes,
                               mem_limit=mem_limit if s == stage else None) for s in contract.STAGES}
        ops["evaluate"] >> ops["export"]
    return ops[stage]


EXIT_TABLE = [
    # stage, what the container runs, mem_limit, expected exception, retried by Airflow?
    ("evaluate", f"echo working; echo '{RESULT}'; exit {contract.ExitCode.NOT_BLESSED}", None,
     DownstreamTasksSkipped, False),
    ("prep", f"exit {contract.ExitCode.BAD_INPUT}", None, StageRejectedError, False),
    # the data gate rejected the data: not retried, and its findings stay in XCom for the note and lineage
    ("validate", f"echo '{GATE}'; exit {contract.ExitCode.DATA_REJECTED}", None, StageRejectedError, False),
    ("train", f"exit {contract.ExitCode.BAD_INPUT}", None, StageRejectedError, False),
    ("train", f"exit {contract.ExitCode.DIVERGED}", None, StageRejectedError, False),
    # a directory it writes is not writable, and nothing prepares them in this try: no retry helps
    ("export", f"exit {contract.ExitCode.DIRS_NOT_READY}", None, StageRejectedError, False),
    ("train", "exit 1", None, StageFailedError, True),
    # a child shell SIGKILLed (PID 1 of a container cannot be signalled from inside): exit 137
    ("train", 'sh -c "kill -KILL \\$\\$"', None, StageFailedError, True),
    ("train", "python3 -c \"x = b'x' * (512 << 20)\"", "64m", StageFailedError, True),
    ("train", "exit 143", None, StageFailedError, True),
    ("export", "exit 2", None, StageFailedError, True),
    # NOT_BLESSED from any stage but evaluate is just a failure
    ("train", f"exit {contract.ExitCode.NOT_BLESSED}", None, StageFailedError, True),
]


@pytest.mark.parametrize("stage,script,mem_limit,expected,retried", EXIT_TABLE,
                         ids=[f"{r[0]}-{r[1][:24]}-{r[2]}" for r in EXIT_TABLE])
def test_real_container_exits_map_through_the_operator(stage, script, mem_limit, expected, retried,
                                                       trainer_image, docker_client, tmp_path):
    op = _operator(stage, trainer_image, tmp_path, mem_limit)
    op.command = ["sh", "-c", script]
    op.container_name = f"tfpipe-exit-codes-{uuid.uuid4().hex[:10]}"
    op.labels = {"tfpipe.test": "exit-codes"}
    ti = _RecordingTI()
    op._fresh = True  # started by this try: followed from its first line, as submit_job leaves it
    with pytest.raises(expected) as err:
        container = op._create_and_start()
        op.poll_until_complete(container["Id"], {"ti": ti})
    assert isinstance(err.value, AirflowFailException) is (not retried and expected is not DownstreamTasksSkipped)
    assert docker_client.containers.list(all=True, filters={"name": op.container_name}) == [], "container left"
    if expected is DownstreamTasksSkipped:
        assert err.value.tasks == ["export"]
        assert ti.pushed["return_value"] == {"blessing": {"blessed": False}}
        return
    code = err.value.exit_code
    if mem_limit:
        assert code == 137 and err.value.oom_killed
        assert "out-of-memory" in str(err.value) and f"mem_limit={mem_limit}" in str(err.value)
    elif "KILL" in script:
        assert code == 137 and not err.value.oom_killed and "killed" in str(err.value)
    else:
        assert code == int(script.split()[-1])
        assert f"(exit {code})" in str(err.value)
    if code == contract.ExitCode.DATA_REJECTED:
        assert ti.pushed["return_value"]["anomalies"] == [{"column": "w", "check": "numeric_drift"}]
        assert "data rejected by the data gate" in str(err.value)


def test_the_docs_exit_codes_are_the_contract_s_numbers():
    """The docs' architecture page lists the exit codes by number (users match on them in alerts
    and in their own stages): each number there is the contract's, so renumbering fails here."""
    import re

    from tests.conftest import REPO

    docs = REPO / "docs"
    architecture = (docs / "architecture.md").read_text()
    paragraph = architecture[architecture.index("2. **The exit code**"):]
    paragraph = paragraph[:paragraph.index("\n\n")]
    listed = {int(n): words.strip() for n, words in re.findall(r"`(\d+)` ([a-z][a-z ]+)", paragraph)}
    expected = {contract.ExitCode.OK: "success", contract.ExitCode.NOT_BLESSED: "not blessed",
                contract.ExitCode.BAD_INPUT: "bad input or config and",
                contract.ExitCode.DIVERGED: "diverged training",
                contract.ExitCode.DIRS_NOT_READY: "a directory the stage writes is not writable by its user",
                contract.ExitCode.DATA_REJECTED: "the data gate rejected the data",
                contract.ExitCode.KILLED: "included"}
    assert listed == expected
    assert (contract.ExitCode.OK, contract.ExitCode.NOT_BLESSED, contract.ExitCode.BAD_INPUT,
            contract.ExitCode.DIVERGED, contract.ExitCode.DIRS_NOT_READY, contract.ExitCode.DATA_REJECTED) == (
                0, 10, 11, 12, 13, 14)
    # the two other places the docs name a code by number
    pages = " ".join(" ".join(page.read_text().split()) for page in docs.glob("*.md"))
    assert "training diverged (exit 12)" in pages and "(exit 12, no retry)" in pages
    assert "fails with exit code 14 and is **not retried**" in pages
