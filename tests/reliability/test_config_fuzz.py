"""Property test: random pipeline configs raise nothing but the project's own config error."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfpipe.config import PipelineConfig
from tfpipe.exceptions import TfpipeConfigError

pytestmark = pytest.mark.reliability

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=string.printable, max_size=30),
    st.sampled_from(["/", "/srv/x", "data", "latest", "all", "gs://b/p", "0 3 * * *", "mlp", "csv", "1000:1000"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=12)

SECTION_KEYS = {
    "image": ["ref", "allow_floating_tag"],
    "volumes": ["data", "work", "models"],
    "data": ["path", "format", "label", "features", "key", "image_size", "channels", "eval_fraction",
             "split_seed", "shard_size"],
    "training": ["model", "model_kwargs", "code_path", "epochs", "batch_size", "learning_rate", "optimizer",
                 "learning_rate_schedule",
                 "learning_rate_warmup_epochs", "seed", "checkpoint_every_steps", "keep_checkpoints", "steps_per_loop",
                 "mixed_precision", "cache", "warm_start", "early_stopping_patience", "early_stopping_monitor",
                 "early_stopping_min_delta", "gradient_clip_norm", "class_weight"],
    "evaluation": ["metric", "threshold", "tolerance"],
    "export": ["model_name", "keep_versions"],
    "resources": ["gpus", "gpu_fallback", "mem_limit", "shm_size", "user", "network_mode", "environment"],
}


@st.composite
def configs(draw):
    cfg = {
        "dag_id": draw(st.one_of(st.just("d"), scalars)),
        "image": {"ref": "tfpipe/trainer:0.1.0"},
        "volumes": {"data": "/srv/d", "work": "/srv/w", "models": "/srv/m"},
        "data": {"path": "x.csv"},
    }
    for section, keys in SECTION_KEYS.items():
        if draw(st.booleans()):
            sub = dict(cfg.get(section, {}))
            for key in draw(st.lists(st.sampled_from(keys + ["bogus"]), max_size=3)):
                sub[key] = draw(values)
            cfg[section] = sub if draw(st.integers(0, 9)) else draw(values)
    for key in draw(st.lists(st.sampled_from(["schedule", "retries", "data_asset", "docker_url", "bogus"]),
                             max_size=2)):
        cfg[key] = draw(values)
    return cfg


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_random_configs_only_raise_config_errors(cfg):
    try:
        built = PipelineConfig.from_dict(cfg)
    except TfpipeConfigError as err:
        assert "Fix:" in str(err)
    else:
        assert isinstance(built, PipelineConfig)
