"""The hand-written DAG ``dag_parse_ratio`` compares against stays the same DAG as ``dags/tfpipe_digits.py``."""

from __future__ import annotations

import runpy
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _dag(path: Path):
    return runpy.run_path(str(path), run_name="bench_reference_check")


def test_handwritten_reference_has_the_same_tasks_params_and_doc_size(monkeypatch, tmp_path):
    monkeypatch.setenv("TFPIPE_HOME", str(tmp_path))
    tfpipe = _dag(REPO / "dags" / "tfpipe_digits.py")["dag"]
    namespace = _dag(REPO / "bench" / "dags" / "handwritten_digits.py")
    hand = namespace["dag"]

    def params(dag):
        return {name: (p.value, {k: v for k, v in p.schema.items() if k != "$schema"}, p.description)
                for name, p in dag.params.items()}

    assert params(hand) == params(tfpipe)
    assert sorted(hand.task_dict) == sorted(tfpipe.task_dict)
    assert {t: hand.task_dict[t].trigger_rule for t in hand.task_dict} == \
        {t: tfpipe.task_dict[t].trigger_rule for t in tfpipe.task_dict}
    assert {t: hand.task_dict[t].retries for t in hand.task_dict} == {t: tfpipe.task_dict[t].retries for t in tfpipe.task_dict}
    assert {t: hand.task_dict[t].outlets for t in hand.task_dict} == {t: tfpipe.task_dict[t].outlets for t in tfpipe.task_dict}
    assert abs(len(hand.doc_md) - len(tfpipe.doc_md)) <= 0.1 * len(tfpipe.doc_md)
    task_docs = lambda dag: sum(len(t.doc_md or "") for t in dag.tasks)  # noqa: E731
    assert abs(task_docs(hand) - task_docs(tfpipe)) <= 0.25 * task_docs(tfpipe)
    assert hand.timetable == tfpipe.timetable and hand.max_active_runs == tfpipe.max_active_runs
