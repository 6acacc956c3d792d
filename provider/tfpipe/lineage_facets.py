"""tfpipe's custom OpenLineage dataset facets; imported only when OpenLineage sends events (needs ``openlineage-python``)."""

from __future__ import annotations

from typing import Any, ClassVar

import attr
from openlineage.client.facet_v2 import DatasetFacet

_SCHEMA = "https://github.com/tfpipe/airflow-provider-tfpipe/blob/main/docs/openlineage.md#"


@attr.define
class _TfpipeFacet(DatasetFacet):
    #: the facet's key in a dataset's facets, and its anchor in the schema page
    name: ClassVar[str] = ""

    @classmethod
    def _get_schema(cls) -> str:
        return _SCHEMA + cls.name


@attr.define
class TfpipeFingerprintDatasetFacet(_TfpipeFacet):
    """The content fingerprint prep computed over the raw data (and keys its dataset dir by)."""

    name: ClassVar[str] = "tfpipe_fingerprint"
    fingerprint: str


@attr.define
class TfpipeWindowDatasetFacet(_TfpipeFacet):
    """The date window prep read (``data.window_days``): its first and last day, its end, and the
    partitions read and missing (``<partition_key>=YYYY-MM-DD``)."""

    name: ClassVar[str] = "tfpipe_window"
    partition_key: str
    days: int
    end: str
    first: str
    last: str
    partitions: list[str]
    missing: list[str]


@attr.define
class TfpipeMetricsDatasetFacet(_TfpipeFacet):
    """Training or evaluation metrics of a model (name -> value)."""

    name: ClassVar[str] = "tfpipe_metrics"
    metrics: dict[str, float]


@attr.define
class TfpipeBlessingDatasetFacet(_TfpipeFacet):
    """The evaluation gate's decision: the metric against the threshold and the baseline version."""

    name: ClassVar[str] = "tfpipe_blessing"
    blessed: bool
    metric: str | None = None
    value: float | None = None
    threshold: float | None = None
    tolerance: float | None = None
    reason: str | None = None
    baseline_version: int | None = None
    baseline_value: float | None = None


@attr.define
class TfpipeImageDatasetFacet(_TfpipeFacet):
    """The trainer image (pinned tag or digest) that made the model."""

    name: ClassVar[str] = "tfpipe_image"
    image: str


@attr.define
class TfpipeTrialDatasetFacet(_TfpipeFacet):
    """The sweep trial a model comes from: its index, its settings, the metric that chose it and its value,
    and how many trials the sweep ran."""

    name: ClassVar[str] = "tfpipe_trial"
    trial: int
    params: dict[str, Any]
    metric: str
    value: float | None = None
    trials: int | None = None


FACETS: dict[str, Any] = {facet.name: facet for facet in (
    TfpipeFingerprintDatasetFacet, TfpipeWindowDatasetFacet, TfpipeMetricsDatasetFacet, TfpipeBlessingDatasetFacet,
    TfpipeImageDatasetFacet, TfpipeTrialDatasetFacet)}
