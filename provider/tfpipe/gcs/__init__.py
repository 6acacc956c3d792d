"""Google Cloud Storage transfers: :mod:`~tfpipe.gcs.plan` (pure), :mod:`~tfpipe.gcs.sync` (stage-in)
and :mod:`~tfpipe.gcs.publish`.
"""

from __future__ import annotations

import time


class Progress:
    """Says when a progress line is due: the last item, every tenth of the total, or every 10 seconds."""

    def __init__(self, every_seconds: float = 10.0) -> None:
        self.every = every_seconds
        self.last = time.monotonic()
        self.last_done = 0

    def due(self, done: int, total: int) -> bool:
        """Whether to log ``done`` of ``total`` now."""
        now = time.monotonic()
        tenth = max(1, total // 10)
        if done >= total or done // tenth > self.last_done // tenth or now - self.last >= self.every:
            self.last, self.last_done = now, done
            return True
        return False


def megabytes(num_bytes: int) -> str:
    return f"{num_bytes / 1e6:.1f} MB"
