"""Parquet tables in the pipeline config: ``data.format: parquet`` counts as a table wherever CSV does."""

from __future__ import annotations

import pytest

from tests.provider.test_config import GOOD
from tfpipe.config import PipelineConfig
from tfpipe.dag_factory import pipeline_params
from tfpipe.exceptions import TfpipeConfigError


def parquet(**data):
    return dict(GOOD, data=dict({"path": "events", "format": "parquet"}, **data))


def test_a_parquet_table_trains_the_mlp_with_column_types_and_a_date_window():
    cfg = PipelineConfig.from_dict(dict(parquet(columns={"zip": "categorical"}, window_days=7),
                                        training={"model": "mlp"}))
    assert (cfg.data.format, cfg.training.model, cfg.data.window_days) == ("parquet", "mlp", 7)
    assert cfg.data.columns == {"zip": "categorical"}


def test_the_trigger_form_offers_the_mlp_for_a_parquet_table():
    model = pipeline_params(PipelineConfig.from_dict(parquet()))["model"]
    assert "mlp" in model.schema["enum"] and "cnn" not in model.schema["enum"]


@pytest.mark.parametrize("model", ["cnn", "resnet50"])
def test_an_image_model_on_a_parquet_table_is_refused(model):
    with pytest.raises(TfpipeConfigError) as err:
        PipelineConfig.from_dict(dict(parquet(), training={"model": model}))
    assert str(err.value) == f"training.model: {model!r} needs images, data.format is 'parquet'. Fix: use 'mlp'."


def test_sharded_prep_of_a_parquet_table_maps_its_shards_and_of_images_is_refused_with_the_fix():
    """A Parquet table may be prepared by shards (slices of its files); an image folder may not."""
    cfg = PipelineConfig.from_dict(parquet(shards=2))
    assert cfg.data.shards == 2 and cfg.data.format == "parquet"
    with pytest.raises(TfpipeConfigError) as err:
        PipelineConfig.from_dict(dict(parquet(shards=2, format="images")))
    assert str(err.value) == ("data.shards: sharded prep reads CSV and Parquet tables, data.format is 'images'. "
                              "Fix: set data.shards to 1 (one prep task reads image folders).")
