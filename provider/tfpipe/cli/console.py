"""What ``tfpipe run`` shows on its terminal: the stages as they start and end, training's epochs, the result.

Airflow's own log goes to a file (:func:`airflow_log_path`; ``-v`` prints it). Stages come from an
Airflow listener, epochs from the task log events; on a terminal a ``rich`` progress bar, else plain lines.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

import pluggy

#: The trainer's line at the end of each epoch (``trainer/train.py``), as its container prints it:
#: ``epoch 3/15: loss 0.1234 accuracy 0.9612 val_loss 0.2345 val_accuracy 0.9500 (...)``.
EPOCH_LINE = re.compile(r"\bepoch (?P<epoch>\d+)/(?P<epochs>\d+): loss (?P<loss>\S+) accuracy (?P<accuracy>\S+) "
                        r"val_loss (?P<val_loss>\S+) val_accuracy (?P<val_accuracy>\S+)")


def airflow_log_path(dag_id: str) -> Path:
    """``$AIRFLOW_HOME/logs/tfpipe-run/<dag_id>/<UTC start>.log``: beside Airflow's own logs, one per run.

    Found without importing Airflow: the file must take Airflow's output before its logging is set up.
    """
    home = Path(os.path.expanduser(os.environ.get("AIRFLOW_HOME") or "~/airflow"))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H-%M-%SZ")
    folder = home / "logs" / "tfpipe-run" / dag_id
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stamp}.log"
    n = 1
    while path.exists():  # two runs started in the same second
        n += 1
        path = folder / f"{stamp}-{n}.log"
    return path


#: Airflow's listener marker (``airflow.listeners.hookimpl`` is this one): made here from pluggy, so
#: that this module loads before Airflow does.
hookimpl = pluggy.HookimplMarker("airflow")


def _listener_manager() -> Any:
    """The listener manager the task runner calls (the Task SDK's; Airflow's own before the SDK had one)."""
    try:
        from airflow.sdk.listener import get_listener_manager
    except ImportError:
        from airflow.listeners.listener import get_listener_manager
    return get_listener_manager()


class RunConsole:
    """The terminal's view of one ``tfpipe run``; :meth:`install` hooks it into Airflow."""

    def __init__(self, dag_id: str, log_path: Path | None, stream: TextIO | None = None) -> None:
        self.dag_id = dag_id
        self.log_path = log_path
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.begun = time.monotonic()
        self.started: dict[str, float] = {}
        self.seen: set[str] = set()
        self.running: str | None = None
        self._bar: Any = None
        self._bar_task: Any = None
        self._last_epoch: str | None = None

    # -- output -----------------------------------------------------------------------------------

    def line(self, text: str) -> None:
        """One line on the terminal, stamped with the local time."""
        stamped = f"{time.strftime('%H:%M:%S')}  {text}"
        if self._bar is not None:
            self._bar.console.print(stamped, markup=False, highlight=False, soft_wrap=True)
        else:
            print(stamped, file=self.stream, flush=True)

    def begin(self, conf: dict[str, Any] | None) -> None:
        shown = f" with conf {conf}" if conf else ""
        self.line(f"{self.dag_id}: starting a run{shown}; Airflow's log: {self.log_path} (-v prints it here)")

    def loaded(self, dags_folder: str) -> None:
        self.line(f"{self.dag_id}: DAG loaded from {dags_folder} and written to the metadata DB "
                  f"({time.monotonic() - self.begun:.1f} s)")

    def finish(self, summary: dict[str, Any]) -> None:
        """The tasks no listener saw (never ran: upstream failed, skipped by a branch), then the result."""
        for key, info in summary.get("tasks", {}).items():
            if key not in self.seen and info.get("state") not in (None, "success"):
                self.line(f"{key}: {info['state']}")
        result = f"{self.dag_id}: run {summary.get('run_id')} {summary.get('state')} " \
                 f"in {time.monotonic() - self.begun:.1f} s"
        if summary.get("model_dir"):
            result += f"; model {summary['model_dir']}"
        metrics = {k: v for k, v in (summary.get("metrics") or {}).items() if isinstance(v, (int, float))}
        if metrics:
            result += " (" + ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items())) + ")"
        if summary.get("blessed") is False:
            result += "; not blessed: not exported"
        if summary.get("published"):
            result += f"; published {summary['published']}"
        self.line(result)
        self.name_log()

    def name_log(self) -> None:
        if self.log_path is not None:
            print(f"          Airflow's log of this run: {self.log_path}", file=self.stream, flush=True)

    # -- Airflow listener: the task runner calls these in this process ------------------------------

    @staticmethod
    def _key(task_instance: Any) -> str:
        index = getattr(task_instance, "map_index", -1)
        return f"{task_instance.task_id}[{index}]" if index is not None and index >= 0 else task_instance.task_id

    def _ended(self, task_instance: Any, what: str) -> str:
        key = self._key(task_instance)
        self._stop_bar()
        self.running = None
        took = time.monotonic() - self.started.pop(key, time.monotonic())
        self.line(f"{key}: {what} ({took:.1f} s)")
        return key

    @hookimpl
    def on_task_instance_running(self, previous_state: Any, task_instance: Any) -> None:
        key = self._key(task_instance)
        self.seen.add(key)
        self.started[key] = time.monotonic()
        self.running = key
        try_number = getattr(task_instance, "try_number", 1) or 1
        self.line(f"{key}: started" + (f" (try {try_number})" if try_number > 1 else ""))

    @hookimpl
    def on_task_instance_success(self, previous_state: Any, task_instance: Any) -> None:
        self._ended(task_instance, "success")

    @hookimpl
    def on_task_instance_skipped(self, previous_state: Any, task_instance: Any) -> None:
        self._ended(task_instance, "skipped")

    @hookimpl
    def on_task_instance_failed(self, previous_state: Any, task_instance: Any, error: Any) -> None:
        from tfpipe.compat import state_name

        retry = state_name(getattr(task_instance, "state", None)) == "up_for_retry"
        self._ended(task_instance, "failed, to be retried" if retry else "failed")
        if error is not None:
            text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
            for part in text.splitlines() or [""]:  # in full: it says what went wrong and the fix
                print(f"          {part}", file=self.stream, flush=True)

    # -- training progress, from the train task's log ---------------------------------------------

    def saw(self, message: str) -> None:
        """A log line of this process; a trainer epoch line while a task runs moves the progress."""
        if self.running is None or "epoch " not in message:
            return
        match = EPOCH_LINE.search(message)
        if match is None:
            return
        epoch, epochs = int(match["epoch"]), int(match["epochs"])
        metrics = (f"loss {match['loss']}  accuracy {match['accuracy']}  val_loss {match['val_loss']}  "
                   f"val_accuracy {match['val_accuracy']}")
        self._last_epoch = f"{self.running}: epoch {epoch}/{epochs}  {metrics}"
        if not self.tty:
            self.line(self._last_epoch)
            return
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            # auto_refresh off: no refresh thread, so nothing is left running when the command ends
            self._bar = Progress(TextColumn("          {task.description}"), BarColumn(bar_width=24),
                                 MofNCompleteColumn(), TextColumn("epochs  {task.fields[metrics]}"),
                                 TimeElapsedColumn(),
                                 console=Console(file=self.stream), auto_refresh=False, transient=True)
            self._bar.start()
            self._bar_task = self._bar.add_task(self.running, total=epochs, metrics="")
        self._bar.update(self._bar_task, completed=epoch, total=epochs,
                         metrics=f"loss {match['loss']}  val_accuracy {match['val_accuracy']}")
        self._bar.refresh()

    def _stop_bar(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            if self._last_epoch:  # the bar is gone from the screen: its last state stays as a line
                self.line(self._last_epoch)
        self._last_epoch = None

    def process(self, logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        """structlog processor: hand the event's text to :meth:`saw`, change nothing."""
        event = event_dict.get("event")
        if isinstance(event, str):
            args = event_dict.get("positional_args")
            if args:
                try:
                    event = event % args
                except (TypeError, ValueError):
                    pass
            self.saw(event)
        return event_dict

    # -- hooking in -------------------------------------------------------------------------------

    def install(self) -> None:
        """Listen to the task runner, and see every log event of this process (Airflow's logging is set up)."""
        import structlog

        _listener_manager().add_listener(self)

        processors = list(structlog.get_config()["processors"])
        # before the last one, the renderer, which turns the event into text
        structlog.configure(processors=[*processors[:-1], self.process, processors[-1]])
        for handler in logging.getLogger().handlers:
            handler.addFilter(self._watch)

    def _watch(self, record: logging.LogRecord) -> bool:
        """A logging filter: hands each record of the standard library's loggers to :meth:`saw`; drops none."""
        try:
            self.saw(record.getMessage())
        except Exception:  # noqa: BLE001 -- the progress display never costs a log line
            pass
        return True
