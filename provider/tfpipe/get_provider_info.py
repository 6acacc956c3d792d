"""Provider metadata read by Airflow's ``apache_airflow_provider`` entry point."""

from __future__ import annotations


def get_provider_info() -> dict:
    """Return the provider info that ``airflow providers list`` shows."""
    return {
        "package-name": "airflow-provider-tfpipe",
        "name": "tfpipe",
        "description": "Scheduled TensorFlow 2.9 training pipelines (prep, train, evaluate, export) "
        "in pinned GPU containers, resuming from checkpoints on failure.",
        "versions": ["0.1.0"],
        "integrations": [
            {
                "integration-name": "tfpipe",
                "tags": ["software"],
            }
        ],
        "operators": [{"integration-name": "tfpipe",
                       "python-modules": ["tfpipe.operators.docker", "tfpipe.operators.gcs"]}],
        "extra-links": ["tfpipe.links.RunReportLink", "tfpipe.links.TensorBoardLink"],
        "hooks": [{"integration-name": "tfpipe", "python-modules": ["tfpipe.hooks.docker", "tfpipe.hooks.gcs"]}],
    }
