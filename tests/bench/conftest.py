"""The bench's modules import each other by name from ``bench/``, as ``bench/run.py`` runs them."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
