#!/usr/bin/env python3
"""``make bench``: tfpipe's speed ratios, measured as interleaved A/B pairs on this machine.

    .venv/bin/python bench/run.py --list
    .venv/bin/python bench/run.py --only dag_parse_ratio --pairs 3

The method and the figures: ``bench/README.md``; the harness: ``bench/harness.py``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness and figures, when imported from elsewhere
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "provider"))  # tfpipe, without the editable install

import harness  # noqa: E402
from figures import (  # noqa: E402
    checkpoint_overhead_ratio,
    dag_parse_ratio,
    gcs_stage_in_ratio,
    input_pipeline_ratio,
    orchestration_overhead_ratio,
    prep_mixed_rows_per_s,
    prep_rows_per_s,
    provider_cost_ratio,
    resume_cost_ratio,
    rss_drift_ratio,
    sweep_overhead_ratio,
    train_loop_ratio,
)

FIGURES = [module.FIGURE for module in (
    dag_parse_ratio, provider_cost_ratio, orchestration_overhead_ratio, gcs_stage_in_ratio, input_pipeline_ratio,
    checkpoint_overhead_ratio, train_loop_ratio, prep_rows_per_s, prep_mixed_rows_per_s, rss_drift_ratio,
    resume_cost_ratio, sweep_overhead_ratio)]

if __name__ == "__main__":
    sys.exit(harness.main(FIGURES))
