"""Pipeline config validation: good configs build, bad ones name the field and the fix."""

from __future__ import annotations

from datetime import date, datetime, timezone

import pytest
from pydantic import ValidationError

from tfpipe.config import (
    DataConfig,
    ExportConfig,
    ImageConfig,
    PipelineConfig,
    TrainingConfig,
    VolumesConfig,
    check_image_ref,
    check_name,
)
from tfpipe.exceptions import TfpipeConfigError

GOOD = {
    "dag_id": "digits",
    "image": {"ref": "tfpipe/trainer:0.1.0"},
    "volumes": {"data": "/srv/tfpipe/data", "work": "/srv/tfpipe/work", "models": "/srv/tfpipe/models"},
    "data": {"path": "digits/digits.csv"},
}


def with_(path: str, value):
    """A copy of GOOD with one dotted key set (``None`` sentinel deletes it)."""
    import copy

    cfg = copy.deepcopy(GOOD)
    node = cfg
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    if value is DELETE:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return cfg


DELETE = object()


def test_good_config_builds_with_defaults():
    cfg = PipelineConfig.from_dict(GOOD)
    assert cfg.training.epochs == 10
    assert cfg.resources.user == "1000:1000"
    assert cfg.volumes.work == "/srv/tfpipe/work"
    assert cfg.model_asset_uri == "tfpipe://models/model"


def test_config_is_frozen():
    cfg = PipelineConfig.from_dict(GOOD)
    with pytest.raises(ValidationError, match="frozen"):
        cfg.training.epochs = 3  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        cfg.dag_id = "other"  # type: ignore[misc]


def test_sections_may_be_given_as_models_or_as_mappings():
    """``PipelineConfig(...)`` takes each section as its model or as a plain mapping, alike."""
    as_models = PipelineConfig(dag_id="digits", image=ImageConfig(ref="tfpipe/trainer:0.1.0"),
                               volumes=VolumesConfig(**GOOD["volumes"]), data=DataConfig(path="digits/digits.csv"),
                               training=TrainingConfig(epochs=3), export=ExportConfig(model_name="digits"))
    as_mappings = PipelineConfig(**{**GOOD, "training": {"epochs": 3}, "export": {"model_name": "digits"}})
    assert as_models == as_mappings and as_models.training.epochs == 3
    assert as_models.export.to_dict() == {"model_name": "digits", "keep_versions": 5}


def test_keyword_construction_errors_read_like_from_dict_ones():
    with pytest.raises(TfpipeConfigError, match=r"^training\.epoch: unknown key\. Fix: remove it \(did you mean "):
        PipelineConfig(**{**GOOD, "training": {"epoch": 3}})
    with pytest.raises(TfpipeConfigError, match=r"^data\.shards: must be a whole number >= 1"):
        DataConfig(path="x.csv", shards=0)


# (mutation, substrings the message must contain: the field and the fix)
BAD_CONFIGS = [
    (with_("trainig", {}), ["trainig", "did you mean 'training'"]),
    (with_("training.epoch", 3), ["training.epoch", "did you mean 'epochs'"]),
    (with_("training.epochs", 0), ["training.epochs", ">= 1"]),
    (with_("training.epochs", -5), ["training.epochs", ">= 1"]),
    (with_("training.epochs", "10"), ["training.epochs", "whole number"]),
    (with_("training.epochs", 2.5), ["training.epochs", "whole number"]),
    (with_("training.batch_size", 0), ["training.batch_size", ">= 1"]),
    (with_("training.learning_rate", 0), ["training.learning_rate", "> 0"]),
    (with_("training.learning_rate", float("inf")), ["training.learning_rate", "finite"]),
    (with_("training.learning_rate", "fast"), ["training.learning_rate"]),
    (with_("training.optimizer", "adamw"), ["training.optimizer", "'adam'"]),
    (with_("training.model", "transformer"), ["training.model", "mlp"]),
    (with_("training.model", "pkg.mod:build"), ["training.code_path", "code_path"]),
    (with_("training.code_path", "../elsewhere"), ["training.code_path", "leaves the data volume"]),
    (with_("training.mixed_precision", "yes"), ["training.mixed_precision", "boolean"]),
    (with_("image.ref", "tfpipe/trainer"), ["image.ref", "no tag", "allow_floating_tag"]),
    (with_("image.ref", "tfpipe/trainer:latest"), ["image.ref", "floating", "digest"]),
    (with_("image.ref", "tensorflow/tensorflow:gpu"), ["image.ref", "floating"]),
    (with_("image.ref", "repo/img@sha256:abc"), ["image.ref", "64 hex"]),
    (with_("volumes.data", "data"), ["volumes.data", "relative", "absolute"]),
    (with_("volumes.work", "/"), ["volumes.work", "'/'"]),
    (with_("volumes.data", "/var/run/docker.sock"), ["volumes.data", "Docker socket"]),
    (with_("volumes.models", "/var/run"), ["volumes.models", "Docker socket"]),
    (with_("volumes.work", "/srv/tfpipe/data"), ["volumes.work", "read-only"]),
    (with_("volumes", DELETE), ["volumes", "missing"]),
    (with_("data.path", DELETE), ["data.path"]),
    (with_("data.path", "/etc/passwd"), ["data.path", "leaves the data volume"]),
    (with_("data.path", "../secrets"), ["data.path", "leaves the data volume"]),
    (with_("data.format", "tsv"), ["data.format", "'csv'"]),
    (with_("data.eval_fraction", 1.0), ["data.eval_fraction", "(0, 1)"]),
    (with_("data.image_size", [32]), ["data.image_size", "[height, width]"]),
    (with_("data.channels", 2), ["data.channels"]),
    (with_("data.classes", "cat,dog"), ["data.classes", "list of at least two class names", "['cat', 'dog', 'fox']"]),
    (with_("data.classes", ["cat"]), ["data.classes", "at least two"]),
    (with_("data.classes", ["cat", "dog", "cat"]), ["data.classes", "names 'cat' more than once",
                                                    "its position is its class id"]),
    (with_("data.classes", ["cat", " dog"]), ["data.classes[1]", "no leading or trailing spaces", "got ' dog'"]),
    (with_("data.classes", ["cat", ""]), ["data.classes[1]", "got ''"]),
    (with_("data.classes", ["cat", True]), ["data.classes[1]", "got True"]),
    (with_("data.classes", ["cat", 1.5]), ["data.classes[1]", "got 1.5"]),
    (with_("schedule", "every day"), ["schedule", "cron"]),
    (with_("schedule", "61 * * * *"), ["schedule", "cron"]),
    (with_("schedule", "@sometimes"), ["schedule", "preset"]),
    (with_("resources.gpus", "many"), ["resources.gpus", "'all'"]),
    (with_("resources.gpus", -1), ["resources.gpus", ">= 1"]),
    (with_("resources.gpus", ["zero"]), ["resources.gpus", "device ids"]),
    (with_("resources.gpu_fallback", "tpu"), ["resources.gpu_fallback", "'cpu'"]),
    (with_("resources.user", "root"), ["resources.user", "uid:gid"]),
    (with_("resources.network_mode", "host"), ["resources.network_mode", "'none'"]),
    (with_("resources.mem_limit", "lots"), ["resources.mem_limit", "'2g'"]),
    (with_("resources.cpus", 0), ["resources.cpus", "[0.01, 1024]"]),
    (with_("resources.cpus", "4"), ["resources.cpus", "--cpus"]),
    (with_("resources.cpus", True), ["resources.cpus", "number of CPUs"]),
    (with_("resources.timezone", "Mars/Olympus"), ["resources.timezone", "Asia/Shanghai"]),
    (with_("resources.timezone", "../etc/passwd"), ["resources.timezone", "IANA"]),
    (with_("resources.timezone", ""), ["resources.timezone", "IANA"]),
    (with_("resources.jemalloc", "no"), ["resources.jemalloc", "true or false"]),
    (with_("evaluation.threshold", 1.5), ["evaluation.threshold", "[0, 1]"]),
    (with_("evaluation.tolerance", -0.1), ["evaluation.tolerance", "[0, 1]"]),
    (with_("export.model_name", "my model"), ["export.model_name", "letters"]),
    (with_("export.keep_versions", 0), ["export.keep_versions", ">= 1"]),
    (with_("dag_id", "bad id!"), ["dag_id"]),
    (with_("retries", -1), ["retries", "0..20"]),
    (with_("data_asset", "not-a-uri"), ["data_asset", "URI"]),
    (with_("docker_url", "localhost"), ["docker_url", "unix://"]),
    (with_("volumes.models", DELETE), ["volumes.models: is missing", "'/srv/tfpipe/models'"]),
    (with_("volumes.data", ""), ["volumes.data: is not set", "'/srv/tfpipe/data'"]),
    (with_("volumes.work", 7), ["volumes.work", "absolute host path", "'/srv/tfpipe/work'"]),
    (with_("gpu_pool", ""), ["gpu_pool", "e.g. 'gpu'"]),
    (with_("tags", "ml"), ["tags", "list of tag strings", "got 'ml'"]),
    (with_("tags", None), ["tags", "list of tag strings"]),
    (with_("tags", ["ml", 3]), ["tags", "non-empty string", "got 3"]),
    (with_("tags", ["x" * 101]), ["tags", "at most 100 characters"]),
    (with_("start_date", "yesterday"), ["start_date", "'yesterday' is not an ISO 8601", "'2026-01-01'"]),
    (with_("start_date", 20260101), ["start_date", "must be a date or time"]),
    (with_("description", 5), ["description", "must be a string, got 5"]),
]


@pytest.mark.reliability
@pytest.mark.parametrize("mapping,expected", BAD_CONFIGS, ids=[str(i) for i in range(len(BAD_CONFIGS))])
def test_bad_config_names_field_and_fix(mapping, expected):
    with pytest.raises(TfpipeConfigError) as err:
        PipelineConfig.from_dict(mapping)
    message = str(err.value)
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"
    assert "Fix:" in message


@pytest.mark.parametrize("given,expected", [
    ("2026-03-01", datetime(2026, 3, 1)),
    ("2026-03-01T04:30:00Z", datetime(2026, 3, 1, 4, 30, tzinfo=timezone.utc)),
    (date(2026, 3, 1), datetime(2026, 3, 1)),  # what YAML loads an unquoted date as
    (datetime(2026, 3, 1, tzinfo=timezone.utc), datetime(2026, 3, 1, tzinfo=timezone.utc)),
    (None, None),
])
def test_start_date_from_a_mapping_becomes_a_datetime(given, expected):
    cfg = PipelineConfig.from_dict(with_("start_date", given))
    assert cfg.start_date == expected and type(cfg.start_date) is type(expected)


def test_a_start_date_string_reaches_the_dag():
    from tfpipe import training_pipeline

    dag = training_pipeline(PipelineConfig.from_dict({**with_("start_date", "2026-03-01"), "tags": ["ml"]}))
    assert dag.start_date == datetime(2026, 3, 1, tzinfo=timezone.utc)  # naive: Airflow's default zone, UTC here
    assert set(dag.tags) == {"ml"}


def test_no_description_is_an_empty_one_not_the_word_none():
    from tfpipe import training_pipeline

    dag = training_pipeline(PipelineConfig.from_dict(with_("description", None)))
    assert dag.description == "" and "None" not in dag.doc_md.split("**prep")[0]


def test_tags_stay_whole_words_in_a_stable_order():
    assert PipelineConfig.from_dict(with_("tags", ["ml", "digits"])).tags == ("ml", "digits")
    assert PipelineConfig.from_dict(with_("tags", {"ml", "digits"})).tags == ("digits", "ml")


def test_declared_classes_reach_every_stage_as_text_in_their_order():
    from tfpipe.specs import config_template

    cfg = PipelineConfig.from_dict(with_("data.classes", ["fox", 0, "cat"]))
    assert cfg.data.classes == ("fox", "0", "cat")
    for stage in ("prep", "train", "evaluate", "export"):
        assert config_template(cfg, stage)["data"]["classes"] == ["fox", "0", "cat"], stage
    assert PipelineConfig.from_dict(GOOD).data.classes is None
    assert config_template(PipelineConfig.from_dict(GOOD), "prep")["data"]["classes"] is None


def test_model_must_fit_data_format():
    with pytest.raises(TfpipeConfigError, match="training.model.*needs images"):
        PipelineConfig.from_dict(with_("training.model", "cnn"))
    cfg = with_("data.format", "images")
    cfg["training"] = {"model": "cnn"}
    assert PipelineConfig.from_dict(cfg).training.model == "cnn"


@pytest.mark.parametrize("ref", [
    "tensorflow/tensorflow:2.9.3-gpu",
    "tfpipe/trainer:79d004e88bf7",
    "registry.example:5000/team/trainer:1.2",
    "tensorflow/tensorflow@sha256:" + "a" * 64,
])
def test_pinned_images_are_accepted(ref):
    check_image_ref("image.ref", ref)


def test_floating_tag_opt_in():
    cfg = with_("image", {"ref": "tfpipe/trainer:latest", "allow_floating_tag": True})
    assert PipelineConfig.from_dict(cfg).image.ref.endswith(":latest")


def test_training_tunables_are_fields():
    assert set(TrainingConfig.TUNABLE) <= set(TrainingConfig.model_fields)


@pytest.mark.parametrize("schedule", ["0 3 * * *", "*/15 1-5 * * MON-FRI", "0 0 L * *", "30 2 * JAN,JUL 1#2",
                                      "@daily", None])
def test_schedules_croniter_accepts_are_taken(schedule):
    assert PipelineConfig.from_dict(with_("schedule", schedule)).schedule == schedule


@pytest.mark.parametrize("schedule", ["0 3 * * * *", "0 3 * *", "60 * * * *", "* 24 * * *", "*/0 * * * *",
                                      "0 3 * * FUNDAY"])
def test_schedules_croniter_refuses_or_with_other_than_five_fields_are_refused(schedule):
    with pytest.raises(TfpipeConfigError, match=r"^schedule: .* is not a valid 5-field cron expression\. Fix: "):
        PipelineConfig.from_dict(with_("schedule", schedule))


@pytest.mark.parametrize("value", ["digits\n", "\u0661\u0662", "a b", ""])
def test_a_name_with_a_final_newline_a_non_ascii_digit_or_a_space_is_refused(value):
    """Names become file and container names: ASCII letters, digits, '.', '_' and '-' only, to the end."""
    with pytest.raises(TfpipeConfigError, match="must be a name"):
        check_name("model_name", value)
    with pytest.raises(TfpipeConfigError, match="^export.model_name: must be a name"):
        PipelineConfig.from_dict(with_("export.model_name", value))


@pytest.mark.parametrize("key,value", [("user", "1000\n"), ("user", "\u0661\u0662"), ("mem_limit", "2g\n"),
                                       ("shm_size", "\u0662g"), ("user", "1000:"), ("mem_limit", "1.g")])
def test_a_user_or_size_that_docker_would_misread_is_refused(key, value):
    with pytest.raises(TfpipeConfigError, match=f"^resources.{key}: must be"):
        PipelineConfig.from_dict(with_(f"resources.{key}", value))


@pytest.mark.parametrize("key,value", [("user", "1000"), ("user", "0:0"), ("mem_limit", "1.5G"), ("shm_size", "512m"),
                                       ("shm_size", "1024")])
def test_users_and_sizes_in_docker_form_are_taken(key, value):
    assert getattr(PipelineConfig.from_dict(with_(f"resources.{key}", value)).resources, key) == value


def test_a_column_type_that_is_not_one_of_the_column_types_is_refused_with_a_did_you_mean():
    """A misspelt data.columns type fails when the DAG is parsed, naming the column, the types and the closest one."""
    with pytest.raises(TfpipeConfigError) as err:
        PipelineConfig.from_dict(with_("data.columns", {"age": "numeric", "zip": "categoric"}))
    assert str(err.value) == ("data.columns.zip: unknown type 'categoric'. Fix: use one of 'numeric', 'categorical', "
                              "'boolean', 'ignore' (did you mean 'categorical'?).")


@pytest.mark.parametrize("kind,hint", [("Numeric", " (did you mean 'numeric'?)"), ("float", ""), (3, "")])
def test_a_column_type_in_the_wrong_case_or_of_another_kind_is_refused(kind, hint):
    """'Numeric' gets a did-you-mean; a data.features type such as 'float', or a number, lists the types only."""
    with pytest.raises(TfpipeConfigError) as err:
        PipelineConfig.from_dict(with_("data.columns", {"age": kind}))
    assert str(err.value) == (f"data.columns.age: unknown type {kind!r}. Fix: use one of 'numeric', 'categorical', "
                              f"'boolean', 'ignore'{hint}.")


@pytest.mark.parametrize("name", ["", "  ", 7])
def test_a_column_name_that_is_empty_or_not_text_is_refused(name):
    with pytest.raises(TfpipeConfigError, match=r"^data\.columns: keys must be column names as the CSV header writes "
                       r"them, got .*\. Fix: e\.g\. \{'zip': 'categorical'\}\.$"):
        PipelineConfig.from_dict(with_("data.columns", {name: "numeric"}))


@pytest.mark.parametrize("kind", ["ignore", "categorical"])
def test_the_label_column_cannot_be_typed_or_ignored(kind):
    """The label is not a feature: data.columns naming it fails at parse time, before prep would."""
    cfg = with_("data.label", "churned")
    cfg["data"]["columns"] = {"churned": kind}
    with pytest.raises(TfpipeConfigError) as err:
        PipelineConfig.from_dict(cfg)
    assert str(err.value) == ("data.columns.churned: is the label column (data.label), which is not a feature and has "
                              "no type. Fix: remove it from data.columns.")


def test_the_split_key_column_cannot_be_typed():
    cfg = with_("data.key", "customer_id")
    cfg["data"]["columns"] = {"customer_id": "categorical"}
    with pytest.raises(TfpipeConfigError, match=r"^data\.columns\.customer_id: is the key column \(data\.key\), "
                       r"which is not a feature and has no type\. Fix: remove it from data\.columns\.$"):
        PipelineConfig.from_dict(cfg)


def test_column_types_on_image_folders_are_refused():
    cfg = with_("data.format", "images")
    cfg["data"]["columns"] = {"zip": "categorical"}
    cfg["training"] = {"model": "cnn"}
    with pytest.raises(TfpipeConfigError, match=r"^data\.columns: types table columns, data\.format is 'images'\. Fix: "):
        PipelineConfig.from_dict(cfg)


def test_every_column_type_and_na_texts_are_taken():
    cfg = with_("data.columns", {"age": "numeric", "zip": "categorical", "active": "boolean", "note": "ignore"})
    cfg["data"]["na_values"] = ["", "?", "n/a"]
    data = PipelineConfig.from_dict(cfg).data
    assert data.columns == {"age": "numeric", "zip": "categorical", "active": "boolean", "note": "ignore"}
    assert data.na_values == ("", "?", "n/a")
    assert PipelineConfig.from_dict(with_("data.na_values", None)).data.na_values is None


@pytest.mark.parametrize("values,bad", [(["NA", 0], 0), ([None], None), (["?", -1.5], -1.5)])
def test_an_na_value_that_is_not_text_is_refused(values, bad):
    """A cell is text: an NA value written as a number or null would never match one, so it is refused."""
    with pytest.raises(TfpipeConfigError) as err:
        PipelineConfig.from_dict(with_("data.na_values", values))
    assert str(err.value) == (f"data.na_values[{values.index(bad)}]: must be a cell text, got {bad!r}. Fix: quote it, "
                              f"e.g. {str(bad)!r}, or write null for only empty cells.")


def test_columns_or_na_values_of_the_wrong_shape_keep_the_generic_errors():
    with pytest.raises(TfpipeConfigError, match=r"^data\.columns: must be a mapping, got list\. Fix: "):
        PipelineConfig.from_dict(with_("data.columns", ["zip"]))
    with pytest.raises(TfpipeConfigError, match=r"^data\.na_values: must be a list, got 'NA'\. Fix: "):
        PipelineConfig.from_dict(with_("data.na_values", "NA"))


def test_column_types_on_parquet_tables_are_taken():
    """data.columns types the columns of a Parquet table as of a CSV one."""
    cfg = with_("data.format", "parquet")
    cfg["data"]["columns"] = {"tags": "ignore", "zip": "categorical"}
    assert PipelineConfig.from_dict(cfg).data.columns == {"tags": "ignore", "zip": "categorical"}
