"""Secret values kept out of a stage operator's log lines (see :class:`RedactingLog`)."""

from __future__ import annotations

import functools
from typing import Any

_LEVELS = frozenset({"debug", "info", "warning", "error", "exception", "critical"})


class RedactingLog:
    """A logger that writes ``***`` in place of each secret value before anything is logged.

    Airflow masks ``mask_secret`` values only on some log paths (``dag.test`` prints task logs unmasked).
    """

    def __init__(self, log: Any, secrets: list[str]) -> None:
        self._log = log
        self._secrets = sorted(set(secrets), key=len, reverse=True)  # longest first: no partial leftovers

    def redact(self, text: str) -> str:
        """``text`` with every secret value replaced by ``***``."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _emit(self, level: str, msg: Any, *args: Any, **kwargs: Any) -> None:
        text = str(msg) % args if args else str(msg)
        getattr(self._log, level)("%s", self.redact(text), **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in _LEVELS:  # every way to log a line goes through redact()
            return functools.partial(self._emit, name)
        return getattr(self._log, name)
