"""tfpipe's custom OpenLineage dataset facets; imported only when OpenLineage sends events (needs ``openlineage-python``)."""

from __future__ import annotations

from typing import Any

import attr
from openlineage.client.facet_v2 import DatasetFacet

_SCHEMA = "https://github.com/tfpipe/airflow-provider-tfpipe/blob/main/docs/openlineage.md#"


@attr.define
class TfpipeFingerprintDatasetFacet(DatasetFacet):
    """The content fingerprint prep computed over the raw data (and keys its dataset dir by)."""

    fingerprint: str

    @staticmethod
    def _get_schema() -> str:
        return _SCHEMA + "tfpipe_fingerprint"


@attr.define
class TfpipeWindowDatasetFacet(DatasetFacet):
    """The date window prep read (``data.window_days``): its first and last day, its end, and the
    partitions read and missing (``<partition_key>=YYYY-MM-DD``)."""

    partition_key: str
    days: int
    end: str
    first: str
    last: str
    partitions: list[str]
    missing: list[str]

    @staticmethod
    def _get_schema() -> str:
        return _SCHEMA + "tfpipe_window"


@attr.define
class TfpipeMetricsDatasetFacet(DatasetFacet):
    """Training or evaluation metrics of a model (name -> value)."""

    metrics: dict[str, float]

    @staticmethod
    def _get_schema() -> str:
        return _SCHEMA + "tfpipe_metrics"


@attr.define
class TfpipeBlessingDatasetFacet(DatasetFacet):
    """The evaluation gate's decision: the metric against the threshold and the baseline version."""

    blessed: bool
    metric: str | None = None
    value: float | None = None
    threshold: float | None = None
    tolerance: float | None = None
    reason: str | None = None
    baseline_version: int | None = None
    baseline_value: float | None = None

    @staticmethod
    def _get_schema() -> str:
        return _SCHEMA + "tfpipe_blessing"


@attr.define
class TfpipeImageDatasetFacet(DatasetFacet):
    """The trainer image (pinned tag or digest) that made the model."""

    image: str

    @staticmethod
    def _get_schema() -> str:
        return _SCHEMA + "tfpipe_image"


FACETS: dict[str, Any] = {
    "tfpipe_fingerprint": TfpipeFingerprintDatasetFacet,
    "tfpipe_window": TfpipeWindowDatasetFacet,
    "tfpipe_metrics": TfpipeMetricsDatasetFacet,
    "tfpipe_blessing": TfpipeBlessingDatasetFacet,
    "tfpipe_image": TfpipeImageDatasetFacet,
}
