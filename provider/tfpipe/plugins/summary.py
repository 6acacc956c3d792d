"""The one-line summary of a tfpipe DAG run, written into the run's note when the run ends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfpipe.plugins.paths import LOCATION_XCOM_KEY

#: The DB column holds up to 1000 characters.
NOTE_MAX = 1000


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _blessing(evaluate: Mapping[str, Any] | None) -> str | None:
    if not evaluate or "blessed" not in evaluate:
        return None
    metric, value = evaluate.get("metric", "metric"), evaluate.get("value")
    threshold = evaluate.get("threshold")
    baseline = evaluate.get("baseline")
    parts = [f"{'blessed' if evaluate['blessed'] else 'NOT blessed'}, {metric} {_fmt(value)}"]
    if threshold is not None:
        parts.append(f"{'>=' if value is not None and value >= threshold else '<'} threshold {_fmt(threshold)}")
    # newer versions the gate passed over (trained on other classes, without the metric): named, so
    # that an older baseline, or none although versions exist, is not a surprise
    passed = [f"v{p.get('version')}" for p in evaluate.get("passed_over") or () if isinstance(p, Mapping)]
    passed_text = f"; passed over {' '.join(passed)}" if passed else ""
    if isinstance(baseline, Mapping):
        parts.append(f"(baseline v{baseline.get('version')} {_fmt(baseline.get('value'))}{passed_text})")
    else:
        parts.append(f"(no baseline{passed_text})")
    return " ".join(parts)


def _data_gate(validate: Mapping[str, Any] | None) -> str | None:
    """What the data gate found, when it found anything: each anomaly as column, measure, value > threshold."""
    if not validate or not validate.get("anomalies"):
        return None
    found = []
    for anomaly in validate["anomalies"]:
        if not isinstance(anomaly, Mapping):
            continue
        what = f"{anomaly.get('column') or 'data set'} {anomaly.get('check')}"
        value, threshold = anomaly.get("value"), anomaly.get("threshold")
        if isinstance(value, (int, float)) and isinstance(threshold, (list, tuple)) and len(threshold) == 2:
            what += f" {_fmt(value)} outside [{_fmt(threshold[0])}, {_fmt(threshold[1])}]"  # a ratio's bounds
        elif isinstance(value, (int, float)) and threshold is not None:
            what += f" {_fmt(value)} > {_fmt(threshold)}"
        found.append(what)
    heading = {"rejected": "data rejected", "accepted": "data change accepted",
               "warned": "data anomalies (warn)"}.get(str(validate.get("decision")), "data anomalies")
    baseline = validate.get("baseline")
    against = f" vs v{baseline.get('version')}" if isinstance(baseline, Mapping) else ""
    return f"{heading}{against}: {', '.join(found)}"


def _selection(select: Mapping[str, Any] | None) -> str | None:
    """A sweep's choice: the trial, its settings and its metric, of how many."""
    if not select or select.get("chosen") is None:
        return None
    settings = ", ".join(f"{key}={value}" for key, value in (select.get("params") or {}).items())
    finished = select.get("finished")
    of = f" of {select.get('trials')}" + (f" ({finished} finished)" if finished != select.get("trials") else "")
    return f"trial {select['chosen']}{of} chosen: {settings}, {select.get('metric')} {_fmt(select.get('value'))}"


def summary_line(results: Mapping[str, Mapping[str, Any] | None], *, train_tries: int | None,
                 state: str, failed_tasks: list[str] | tuple[str, ...] = ()) -> str:
    """One line: the data gate's anomalies, a sweep's chosen trial, blessing with metric vs threshold and
    baseline, model version, tries and resumes.

    :param results: stage name -> that task's result (``None`` or missing when it has none).
    :param train_tries: the train task's try number (attempts), ``None`` when it never ran.
    :param state: the run's final state (``success``, ``failed``).
    :param failed_tasks: task ids that failed, named when the run failed.
    """
    parts = []
    blessing = _blessing(results.get("evaluate"))
    if state != "success":
        parts.append(f"run {state}" + (f" at {', '.join(failed_tasks)}" if failed_tasks else ""))
    gate = _data_gate(results.get("validate"))
    if gate:
        parts.append(gate)
    selection = _selection(results.get("select"))
    if selection:
        parts.append(selection)
    if blessing:
        parts.append(blessing)
    export = results.get("export")
    if export and export.get("version") is not None:
        parts.append(f"model {export.get('model_name', '?')} v{export['version']}")
    elif blessing:
        parts.append("no model exported")
    train = results.get("train")
    if train_tries:
        text = f"train {train_tries} {'try' if train_tries == 1 else 'tries'}"
        resumed = (train or {}).get("resumed_from")
        if isinstance(resumed, Mapping) and resumed.get("step") is not None:
            text += f", resumed from step {resumed['step']}"
        parts.append(text)
    line = "tfpipe: " + "; ".join(parts)
    return line if len(line) <= NOTE_MAX else line[: NOTE_MAX - 3] + "..."


def note_for_run(dag_run: Any, session: Any, state: Any = None) -> str | None:
    """The summary of a finished ``DagRun`` from its XComs and task instances, or ``None`` if not tfpipe's.

    ``state``: the run's final state when ``dag_run.state`` may not hold it yet.
    """
    from airflow.models.xcom import XComModel

    from tfpipe.compat import xcom_query

    rows = list(session.scalars(xcom_query(session, run_id=dag_run.run_id, dag_id=dag_run.dag_id)))
    stage_of: dict[str, str] = {}
    for row in rows:
        if row.key == LOCATION_XCOM_KEY:
            value = XComModel.deserialize_value(row)
            if isinstance(value, Mapping) and value.get("stage"):
                stage_of[row.task_id] = str(value["stage"])
    if not stage_of:
        return None
    results: dict[str, Any] = {}
    for row in rows:
        if row.key == "return_value" and row.task_id in stage_of:
            value = XComModel.deserialize_value(row)
            results[stage_of[row.task_id]] = value if isinstance(value, Mapping) else None
    tis = dag_run.get_task_instances(session=session)
    train_tries = max((ti.try_number for ti in tis if stage_of.get(ti.task_id) == "train"), default=None)
    failed = sorted(ti.task_id for ti in tis if ti.state == "failed")
    state = state or dag_run.state
    return summary_line(results, train_tries=train_tries, state=str(getattr(state, "value", state)),
                        failed_tasks=failed)
