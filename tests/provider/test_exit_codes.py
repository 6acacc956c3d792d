"""The exit-code contract between the trainer container and the operator, as one table.

This is the one place a stand-in is used: the table exercises the mapping function with a
minimal task-instance object, as Airflow's Docker provider does for its own exit-code table.
The same codes are produced for real by the trainer in tests/trainer and tests/integration.
"""

from __future__ import annotations

import pytest
from airflow.providers.common.compat.sdk import AirflowFailException, DownstreamTasksSkipped

from tfpipe import contract
from tfpipe.exceptions import StageFailedError, StageRejectedError
from tfpipe.operators.docker import OPERATORS
from tfpipe.specs import config_template
from tfpipe.config import PipelineConfig

from .test_config import GOOD


class _RecordingTI:
    def __init__(self):
        self.pushed = {}

    def xcom_push(self, key, value):
        self.pushed[key] = value


def _operator(stage):
    from airflow.sdk import DAG

    cfg = PipelineConfig.from_dict(GOOD)
    with DAG("exit_codes", schedule=None):
        ops = {s: OPERATORS[s](task_id=s, image=cfg.image.ref, stage_config=config_template(cfg, s),
                               volumes=cfg.volumes) for s in contract.STAGES}
        ops["evaluate"] >> ops["export"]
    return ops[stage]


EXIT_TABLE = [
    # stage, exit code, oom, expected exception, retried by Airflow?
    ("evaluate", contract.ExitCode.NOT_BLESSED, False, DownstreamTasksSkipped, False),
    ("prep", contract.ExitCode.BAD_INPUT, False, StageRejectedError, False),
    ("train", contract.ExitCode.BAD_INPUT, False, StageRejectedError, False),
    ("train", contract.ExitCode.DIVERGED, False, StageRejectedError, False),
    ("train", 1, False, StageFailedError, True),
    ("train", 137, False, StageFailedError, True),
    ("train", 137, True, StageFailedError, True),
    ("train", 143, False, StageFailedError, True),
    ("export", 2, False, StageFailedError, True),
    # NOT_BLESSED from any stage but evaluate is just a failure
    ("train", contract.ExitCode.NOT_BLESSED, False, StageFailedError, True),
]


@pytest.mark.parametrize("stage,code,oom,expected,retried", EXIT_TABLE)
def test_exit_code_table(stage, code, oom, expected, retried):
    op = _operator(stage)
    ti = _RecordingTI()
    logs = ["working", contract.RESULT_PREFIX + '{"blessing": {"blessed": false}}']
    with pytest.raises(expected) as err:
        op._raise_for_exit(code, oom, logs, {"ti": ti})
    assert isinstance(err.value, AirflowFailException) is (not retried and expected is not DownstreamTasksSkipped)
    if expected is DownstreamTasksSkipped:
        assert err.value.tasks == ["export"]
        assert ti.pushed["return_value"] == {"blessing": {"blessed": False}}
    if oom:
        assert "out-of-memory" in str(err.value) and err.value.oom_killed
    if code == 137 and not oom:
        assert "killed" in str(err.value)


def test_exit_code_meanings():
    assert contract.ExitCode.describe(0) == "success"
    assert set(contract.ExitCode.NO_RETRY) == {contract.ExitCode.BAD_INPUT, contract.ExitCode.DIVERGED}
    assert len({contract.ExitCode.NOT_BLESSED, contract.ExitCode.BAD_INPUT, contract.ExitCode.DIVERGED}) == 3
