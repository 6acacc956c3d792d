"""The train stage: learning, history files, resume, corrupt checkpoints, models, warm start."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

# Inside the image TensorFlow must import: a broken image fails collection, never skips.
import tensorflow as tf  # noqa: E402

from conftest import REPO, write_blobs_csv, write_image_folder, write_user_model  # noqa: E402
from trainer import checkpoints, contract, data, prep, train  # noqa: E402
from trainer.errors import BadInput  # noqa: E402


def final_weights(ws, run_id=None, trial=None):
    """The variables of train/final/weights (a sweep trial's: under its own dir) as a name -> array dict."""
    prefix = os.path.join(contract.training_dir(ws.run_dir(run_id), trial), "train", "final", "weights")
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if "model/" in name}


def test_training_learns_and_writes_its_records(ws, capsys):
    prep.run(ws.config("prep"))
    result = train.run(ws.config("train"))
    out = capsys.readouterr().out
    assert "starting from scratch" in out
    assert "epoch 3/3: loss" in out and "val_accuracy" in out and "examples/s, ETA" in out
    assert result["epochs"] == 3 and result["steps"] == 3 * 8  # 245 train rows / batch 32
    assert result["resumed_from"] is None
    history = ws.read("metrics.json")
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert all(h["try_number"] == 1 for h in history)
    assert history[-1]["val_accuracy"] >= 0.9 and history[-1]["loss"] < history[0]["loss"]
    assert result["final_loss"] == history[-1]["loss"]
    attempts = ws.read("attempts.json")
    assert len(attempts) == 1 and attempts[0]["status"] == "completed"
    assert attempts[0]["epochs_run"] == 3 and attempts[0]["steps_run"] == 24
    train_dir = os.path.join(ws.run_dir(), "train")
    assert glob.glob(os.path.join(train_dir, "tensorboard", "events.out.tfevents.*"))
    assert os.path.exists(os.path.join(train_dir, "final", "weights.index"))
    assert ws.read("train", "final", "final.json")["steps"] == 24
    assert tf.train.latest_checkpoint(result["checkpoint_dir"]).endswith("ckpt-24")
    assert ws.read("config", "train.json")["training"]["epochs"] == 3
    assert not os.path.exists(os.path.join(ws.run_dir(), contract.TRIALS_DIR))


def test_a_sweep_trial_keeps_its_training_state_in_its_own_directory(ws):
    """A trial's checkpoints, final weights, history, attempts and recorded config land under
    trials/trial-k, its TensorBoard events under train/tensorboard/trial-k (one TensorBoard over the
    run shows every trial); the run dir gets none of them, so trials training at once share no file."""
    prep.run(ws.config("prep"))
    trial = {"index": 1, "params": {"learning_rate": 0.05}}
    result = train.run(ws.trial_config(trial, training={"epochs": 1}))
    run_dir = ws.run_dir()
    trial_dir = os.path.join(run_dir, "trials", "trial-1")
    assert result["trial"] == trial and result["steps"] == 8
    assert result["final_dir"] == os.path.join(trial_dir, "train", "final")
    assert result["checkpoint_dir"] == os.path.join(trial_dir, "train", "checkpoints")
    assert tf.train.latest_checkpoint(result["checkpoint_dir"]).endswith("ckpt-8")
    assert os.path.exists(os.path.join(trial_dir, "train", "final", "weights.index"))
    assert ws.read("trials", "trial-1", "train", "final", "final.json")["steps"] == 8
    assert [h["epoch"] for h in ws.read("trials", "trial-1", "metrics.json")] == [1]
    assert [a["status"] for a in ws.read("trials", "trial-1", "attempts.json")] == ["completed"]
    recorded = ws.read("trials", "trial-1", "config", "train.json")
    assert recorded[contract.TRIAL_KEY] == trial and recorded["training"]["learning_rate"] == 0.05
    assert os.listdir(os.path.join(run_dir, "train", "tensorboard")) == ["trial-1"]
    assert glob.glob(os.path.join(run_dir, "train", "tensorboard", "trial-1", "events.out.tfevents.*"))
    for name in ("metrics.json", "attempts.json", "train/final", "train/checkpoints", "config/train.json"):
        assert not os.path.exists(os.path.join(run_dir, name)), name
    assert ws.read("dataset.json")["fingerprint"], "the data set pointer stays the run's"


@pytest.mark.parametrize("trial, field", [
    ({"index": -1, "params": {}}, "trial.index: must be a whole number, at least 0, got -1. Fix: "),
    ({"index": 0}, "trial.params: must be an object of setting -> value, got None. Fix: "),
])
def test_a_malformed_trial_is_refused_before_training(ws, trial, field):
    prep.run(ws.config("prep"))
    config = ws.config("train")
    config[contract.TRIAL_KEY] = trial
    with pytest.raises(BadInput) as info:
        train.run(config)
    assert str(info.value).startswith(field)
    assert not os.path.exists(os.path.join(ws.run_dir(), contract.TRIALS_DIR))
    assert not os.path.exists(os.path.join(ws.run_dir(), "train"))


@pytest.mark.resume
def test_rerun_with_more_epochs_resumes_from_the_last_epoch(ws, capsys):
    prep.run(ws.config("prep"))
    train.run(ws.config("train", training={"epochs": 2}))
    capsys.readouterr()
    started = time.time()
    result = train.run(ws.config("train", try_number=2, training={"epochs": 4}))
    elapsed = time.time() - started
    out = capsys.readouterr().out
    ckpt = os.path.join(ws.run_dir(), "train", "checkpoints", "ckpt-16")
    assert "resumed from epoch 2 step 16 (checkpoint %s)" % ckpt in out
    assert "starting from scratch" not in out
    assert result["resumed_from"] == {"epoch": 2, "step": 16, "checkpoint": ckpt}
    assert result["steps"] == 32 and result["epochs"] == 4
    attempts = ws.read("attempts.json")
    assert [a["try_number"] for a in attempts] == [1, 2]
    assert attempts[1]["resumed_from"]["step"] == 16 and attempts[1]["epochs_run"] == 2
    # the resumed try's start-up, phase by phase (no "process" phase: pytest, not python -m trainer)
    startup = attempts[1]["startup_s"]
    assert sorted(startup) == sorted(["dataset", "model", "restore", "first_call", "first_save", "first_eval"])
    assert all(v >= 0 for v in startup.values()) and startup["first_call"] > 0
    assert sum(startup.values()) <= elapsed
    assert "start-up of this try: dataset " in out
    assert [(h["epoch"], h["try_number"]) for h in ws.read("metrics.json")] == [
        (1, 1), (2, 1), (3, 2), (4, 2)]


@pytest.mark.resume
def test_a_killed_tries_record_catches_up_with_the_checkpoint_it_left(ws):
    """A SIGKILL between writing a checkpoint and recording it leaves attempts.json one checkpoint
    behind; the next try resumes from that checkpoint and completes the killed try's record."""
    prep.run(ws.config("prep"))
    settings = {"epochs": 2, "checkpoint_every_steps": 3}  # checkpoints 3, 6, 8, 9, 12, 15, 16
    train.run(ws.config("train", training=settings))
    ckpt_dir = os.path.join(ws.run_dir(), "train", "checkpoints")
    attempts = ws.read("attempts.json")  # as a kill right after ckpt-16 (epoch 2's end) leaves it
    attempts[0].update(status="running", last_checkpoint=os.path.join(ckpt_dir, "ckpt-15"), steps_run=15,
                       epochs_run=1, end_time=None)
    with open(os.path.join(ws.run_dir(), "attempts.json"), "w") as handle:
        json.dump(attempts, handle)
    result = train.run(ws.config("train", try_number=2, training=dict(settings, epochs=3)))
    assert result["resumed_from"]["step"] == 16
    first, second = ws.read("attempts.json")
    assert first["status"] == "interrupted" and first["last_checkpoint"] == os.path.join(ckpt_dir, "ckpt-16")
    assert (first["steps_run"], first["epochs_run"]) == (16, 2)
    assert first["epochs_run"] + second["epochs_run"] == 3


class Crash(Exception):
    pass


def train_until_crash(monkeypatch, config, step):
    """Run the train stage of ``config``, crashing (an exception) right after its checkpoint at ``step``."""
    original = checkpoints.TrainState.save

    def save_then_crash(self):
        path = original(self)
        if int(self.step.numpy()) == step:
            raise Crash("simulated crash after %s" % path)
        return path
    monkeypatch.setattr(checkpoints.TrainState, "save", save_then_crash)
    try:
        with pytest.raises(Crash):
            train.run(config)
    finally:
        monkeypatch.setattr(checkpoints.TrainState, "save", original)


@pytest.mark.resume
def test_resume_from_a_mid_epoch_checkpoint_replays_the_epoch_exactly(ws, monkeypatch, capsys):
    settings = {"epochs": 2, "checkpoint_every_steps": 3}
    for run_id in ("straight", "crashy"):
        prep.run(ws.config("prep", run_id=run_id))
    train.run(ws.config("train", run_id="straight", training=settings))
    expected = final_weights(ws, "straight")

    # 4 batches into epoch 2 (8 steps per epoch)
    train_until_crash(monkeypatch, ws.config("train", run_id="crashy", training=settings), 12)
    assert ws.read("attempts.json", run_id="crashy")[0]["status"] == "failed"
    assert not os.path.exists(os.path.join(ws.run_dir("crashy"), "train", "final"))
    capsys.readouterr()

    result = train.run(ws.config("train", run_id="crashy", try_number=2, training=settings))
    assert "resumed from epoch 1 step 12 " in capsys.readouterr().out
    assert result["steps"] == 16
    resumed = final_weights(ws, "crashy")
    assert sorted(resumed) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(resumed[name], expected[name], rtol=0, atol=1e-6,
                                   err_msg=name)


@pytest.mark.resume
def test_a_crashed_trial_resumes_from_its_own_checkpoint_beside_another_trial(ws, monkeypatch, capsys):
    """Trials 0 and 1 of one run with the same settings: trial 1 crashes 4 batches into epoch 2; its retry
    resumes from its own ckpt-12 (trial 0 has later ones) by the plain train's code, ends with the same
    weights as trial 0, which ran straight through, and leaves trial 0's records as they were."""
    settings = {"epochs": 2, "checkpoint_every_steps": 3}
    prep.run(ws.config("prep"))
    trials = [{"index": k, "params": {"learning_rate": 0.01}} for k in (0, 1)]
    train.run(ws.trial_config(trials[0], training=settings))
    first = os.path.join(ws.run_dir(), "trials", "trial-0")
    records = {name: open(os.path.join(first, name)).read() for name in ("metrics.json", "attempts.json")}

    train_until_crash(monkeypatch, ws.trial_config(trials[1], training=settings), 12)
    assert ws.read("trials", "trial-1", "attempts.json")[0]["status"] == "failed"
    capsys.readouterr()
    result = train.run(ws.trial_config(trials[1], try_number=2, training=settings))
    ckpt = os.path.join(ws.run_dir(), "trials", "trial-1", "train", "checkpoints", "ckpt-12")
    assert "resumed from epoch 1 step 12 (checkpoint %s)" % ckpt in capsys.readouterr().out
    assert result["resumed_from"]["checkpoint"] == ckpt and result["steps"] == 16
    assert [a["status"] for a in ws.read("trials", "trial-1", "attempts.json")] == ["failed", "completed"]
    assert {name: open(os.path.join(first, name)).read() for name in records} == records
    expected, resumed = final_weights(ws, trial=0), final_weights(ws, trial=1)
    assert sorted(resumed) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(resumed[name], expected[name], rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.resume
@pytest.mark.reliability
@pytest.mark.parametrize("cut, keep", [
    ("data", 0.5),
    # TensorFlow renames a checkpoint's data file into place but writes its index in place, last:
    # a SIGKILL while it writes leaves the newest index empty or cut short (a real kill in
    # tests/integration/test_resume.py can land there)
    ("index", 0.0),
    ("index", 0.5),
])
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(ws, capsys, cut, keep):
    prep.run(ws.config("prep"))
    train.run(ws.config("train", training={"epochs": 2}))
    ckpt_dir = os.path.join(ws.run_dir(), "train", "checkpoints")
    pattern = "ckpt-16.data-*" if cut == "data" else "ckpt-16.index"
    damaged = glob.glob(os.path.join(ckpt_dir, pattern))[0]
    size = os.path.getsize(damaged)
    with open(damaged, "r+b") as handle:
        handle.truncate(int(size * keep))
    with open(os.path.join(ckpt_dir, "checkpoint"), "w") as handle:
        handle.write("model_checkpoint_path: {{{ not a text proto")  # the state file too
    capsys.readouterr()
    result = train.run(ws.config("train", try_number=2, training={"epochs": 3}))
    out = capsys.readouterr().out
    warning = [l for l in out.splitlines() if "WARNING" in l and "ckpt-16" in l]
    assert warning and "falling back" in warning[0]
    assert "resumed from epoch 1 step 8 (checkpoint %s)" % os.path.join(ckpt_dir, "ckpt-8") in out
    assert result["steps"] == 24
    assert os.path.exists(os.path.join(ckpt_dir, "corrupt", os.path.basename(damaged)))
    assert tf.train.latest_checkpoint(ckpt_dir).endswith("ckpt-24")
    # the rewritten state no longer lists the corrupt checkpoint, and a new one works
    assert train.run(ws.config("train", try_number=3, training={"epochs": 3}))[
        "resumed_from"]["step"] == 24


@pytest.mark.resume
@pytest.mark.parametrize("changed, names", [
    ({"model_kwargs": {"hidden_units": [16, 8]}}, "incompatible tensor with shape"),
    ({"model_kwargs": {"hidden_units": [64]}}, "incompatible tensor with shape"),
    ({"optimizer": "sgd"}, "not bound to checkpointed values"),
    ({"learning_rate_schedule": "constant"}, "learning_rate"),
    ({"mixed_precision": True}, "not bound to checkpointed values"),
    ({"model": "changed_models.tiny:build", "code_path": "code"}, "incompatible tensor with shape"),
])
def test_a_checkpoint_of_other_training_settings_stops_the_try_and_keeps_every_checkpoint(ws, changed, names):
    """The run's settings changed between tries (its DAG file was edited, then train cleared): the
    checkpoints read but do not fit. Setting them aside as corrupt started the run over (or,
    after a partial restore, failed later with an unrelated error); now the try stops with the
    reason and the fix, and the old settings resume from the same checkpoint."""
    started = {"epochs": 2, "checkpoint_every_steps": 0, "learning_rate_schedule": "cosine"}
    if "code_path" in changed:  # another model altogether: the user's own instead of the mlp
        write_user_model(ws.data, "changed_models")
    prep.run(ws.config("prep"))
    train.run(ws.config("train", training=dict(started, epochs=1)))
    ckpt_dir = os.path.join(ws.run_dir(), "train", "checkpoints")
    try:
        with pytest.raises(BadInput) as info:
            train.run(ws.config("train", try_number=2, training=dict(started, **changed)))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    message = str(info.value)
    assert message.startswith("checkpoint %s does not fit the model and optimizer this try built ("
                              % os.path.join(ckpt_dir, "ckpt-8"))
    assert names in message and "Fix: put back the settings this run started with" in message
    assert saved_steps(ckpt_dir) == [8] and not os.path.exists(os.path.join(ckpt_dir, "corrupt"))
    result = train.run(ws.config("train", try_number=3, training=started))
    assert result["resumed_from"]["step"] == 8 and result["steps"] == 16


@pytest.mark.resume
def test_a_checkpoint_of_another_built_in_model_stops_the_try_and_keeps_every_checkpoint(ws):
    """``training.model`` changed from one built-in to another (cnn to resnet50, on 32x32 images,
    the smallest resnet50 takes) between tries: the try stops naming the checkpoint and the fix,
    the checkpoint stays, and the cnn resumes from it."""
    write_image_folder(os.path.join(ws.data, "imgs"), per_class=8)
    images = {"format": "images", "path": "imgs", "image_size": [32, 32], "channels": 3,
              "eval_fraction": 0.25}
    started = {"model": "cnn", "epochs": 1, "batch_size": 8, "checkpoint_every_steps": 0}
    prep.run(ws.config("prep", data=images))
    first = train.run(ws.config("train", data=images, training=started))
    spe = first["steps_per_epoch"]
    ckpt_dir = os.path.join(ws.run_dir(), "train", "checkpoints")
    assert saved_steps(ckpt_dir) == [spe]
    with pytest.raises(BadInput) as info:
        train.run(ws.config("train", try_number=2, data=images,
                            training=dict(started, model="resnet50", epochs=2)))
    message = str(info.value)
    assert message.startswith("checkpoint %s does not fit the model and optimizer this try built ("
                              % os.path.join(ckpt_dir, "ckpt-%d" % spe)), message
    assert "Fix: put back the settings this run started with" in message
    assert saved_steps(ckpt_dir) == [spe] and not os.path.exists(os.path.join(ckpt_dir, "corrupt"))
    result = train.run(ws.config("train", try_number=3, data=images, training=dict(started, epochs=2)))
    assert result["resumed_from"]["step"] == spe and result["steps"] == 2 * spe


def saved_steps(ckpt_dir):
    """The step numbers of the checkpoints in ``ckpt_dir``, each checked against its step variable."""
    steps = sorted(int(os.path.basename(p)[len("ckpt-"):-len(".index")])
                   for p in glob.glob(os.path.join(ckpt_dir, "ckpt-*.index")))
    for step in steps:
        reader = tf.train.load_checkpoint(os.path.join(ckpt_dir, "ckpt-%d" % step))
        assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == step
    return steps


@pytest.mark.resume
@pytest.mark.reliability
@pytest.mark.parametrize("steps_per_loop, stop", [(1, 13), (3, 14)])
def test_sigterm_mid_epoch_saves_at_the_end_of_the_current_loop(ws, monkeypatch, capsys, steps_per_loop,
                                                                  stop):
    """SIGTERM arrives during step 13 (5 batches into epoch 2 of 8-step epochs): one step per call
    saves ckpt-13; 3 steps per call (calls 1-3, 4-6, 7-8, 9-11, 12-14) finish their call: ckpt-14."""
    prep.run(ws.config("prep"))
    # only epoch ends would checkpoint
    settings = {"epochs": 3, "checkpoint_every_steps": 0, "steps_per_loop": steps_per_loop}
    original = train.Loop.__init__

    def init_then_signal_at_13(self, *args, **kwargs):
        original(self, *args, **kwargs)
        loop_fn, count = self.train_loop, [0]

        def loop_and_maybe_signal(iterator, steps):
            before = count[0]
            loop_fn(iterator, steps)
            count[0] += int(steps)
            if before < 13 <= count[0]:  # the real signal, to this process: the real handler runs
                os.kill(os.getpid(), signal.SIGTERM)
        self.train_loop = loop_and_maybe_signal
    monkeypatch.setattr(train.Loop, "__init__", init_then_signal_at_13)
    with pytest.raises(SystemExit) as info:
        train.run(ws.config("train", training=settings))
    assert info.value.code == 143
    out = capsys.readouterr().out
    ckpt_dir = os.path.join(ws.run_dir(), "train", "checkpoints")
    last = os.path.join(ckpt_dir, "ckpt-%d" % stop)
    assert "stopped at epoch 2 step %d after checkpoint %s" % (stop, last) in out
    assert tf.train.latest_checkpoint(ckpt_dir) == last
    assert saved_steps(ckpt_dir) == [8, stop]
    attempt = ws.read("attempts.json")[0]
    assert attempt["status"] == "interrupted" and attempt["steps_run"] == stop
    assert attempt["last_checkpoint"] == last
    monkeypatch.setattr(train.Loop, "__init__", original)
    result = train.run(ws.config("train", try_number=2, training=settings))
    assert result["resumed_from"]["step"] == stop and result["steps"] == 24


@pytest.mark.resume
def test_loops_of_several_steps_checkpoint_and_resume_on_the_exact_steps(ws, monkeypatch, capsys):
    """3 steps per call, a checkpoint every 5 steps of 8-step epochs: calls end early at 5, 8 (the
    epoch end), 10, 15 and 16, a crash after ckpt-10 resumes at step 10, and the final weights are
    those of a run with one step per call. Two eager saves, then traced ones: ckpt-10, the one
    resumed from, is a traced write."""
    monkeypatch.setattr(checkpoints, "EAGER_SAVES", 2)
    for run_id in ("straight", "looped"):
        prep.run(ws.config("prep", run_id=run_id))
    settings = {"epochs": 2, "checkpoint_every_steps": 5, "keep_checkpoints": 10}
    train.run(ws.config("train", run_id="straight", training=dict(settings, steps_per_loop=1)))
    expected = final_weights(ws, "straight")

    looped = dict(settings, steps_per_loop=3)
    train_until_crash(monkeypatch, ws.config("train", run_id="looped", training=looped), 10)
    ckpt_dir = os.path.join(ws.run_dir("looped"), "train", "checkpoints")
    assert saved_steps(ckpt_dir) == [5, 8, 10]
    # the two eager saves write one data file; the traced write one per device it sees (two here)
    shards = {step: len(glob.glob(os.path.join(ckpt_dir, "ckpt-%d.data-*" % step))) for step in (5, 8, 10)}
    assert shards[5] == shards[8] == 1 and shards[10] > 1, shards
    capsys.readouterr()

    result = train.run(ws.config("train", run_id="looped", try_number=2, training=looped))
    assert "resumed from epoch 1 step 10 " in capsys.readouterr().out
    assert result["steps"] == 16 and saved_steps(ckpt_dir) == [5, 8, 10, 15, 16]
    resumed = final_weights(ws, "looped")
    assert sorted(resumed) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(resumed[name], expected[name], rtol=0, atol=1e-6, err_msg=name)


def test_one_trace_per_step_function_and_one_divergence_check_per_save(ws, monkeypatch):
    """245 train and 55 eval rows at batch 32 end in partial batches, yet each compiled function
    traces once; the automatic loop length runs the 24 steps in a few calls; each save is
    checked for NaN once (3 epoch-end saves, 3 checks: the code before checked twice per epoch
    end and once more before the final weights)."""
    prep.run(ws.config("prep"))
    loops, calls, checks, saves = [], [], [0], [0]
    init, run_loop = train.Loop.__init__, train.Loop._run_loop
    check, save = train.Loop.check_finite, checkpoints.TrainState.save

    def keep(self, *args, **kwargs):
        init(self, *args, **kwargs)
        loops.append(self)

    def counted_loop(self, iterator, steps):
        calls.append(steps)
        return run_loop(self, iterator, steps)

    def counted_check(self, *args):
        checks[0] += 1
        return check(self, *args)

    def counted_save(self):
        saves[0] += 1
        return save(self)
    monkeypatch.setattr(train.Loop, "__init__", keep)
    monkeypatch.setattr(train.Loop, "_run_loop", counted_loop)
    monkeypatch.setattr(train.Loop, "check_finite", counted_check)
    monkeypatch.setattr(checkpoints.TrainState, "save", counted_save)
    result = train.run(ws.config("train", training={"epochs": 3}))  # steps_per_loop: automatic
    loop = loops[0]
    assert result["steps"] == 24 and sum(calls) == 24
    # the tracing call, a timed call, then longer ones (5 calls here; 12 leaves room for a slow,
    # shared machine: a 24-step run in 12 calls needs steps under about 0.2 s)
    assert calls[:2] == [1, 1] and max(calls) > 1 and len(calls) <= 12, calls
    assert saves[0] == 3 and checks[0] == 3
    for function in (loop.train_loop, loop.eval_loop, loop.all_finite):
        assert function.experimental_get_tracing_count() == 1
    assert loop.eval_steps == 2
    # the one-step function (tests/trainer/test_loss_and_gradients.py uses it) too: a full and a partial batch, one trace
    for x, y in data.eval_dataset(loop.base_eval, 32):
        loop.train_step(x, y)
    assert loop.train_step.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("value", [-1, 10001, 2.5])
def test_steps_per_loop_out_of_bounds_is_refused(ws, value):
    from trainer import config as config_mod

    with pytest.raises(BadInput, match=r"training\.steps_per_loop must be"):
        config_mod.resolve(ws.config("train", training={"steps_per_loop": value}))


@pytest.mark.resume
@pytest.mark.reliability
@pytest.mark.integration
def test_sigterm_to_the_training_process_saves_where_it_stopped(ws):
    """A real ``python -m trainer train`` process gets SIGTERM: exit 143, checkpoint at its last step."""
    prep.run(ws.config("prep"))
    config = ws.config("train", training={"epochs": 400, "checkpoint_every_steps": 0})
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env[contract.CONFIG_ENV] = json.dumps(config)
    launched = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "train"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "epoch 2/400" in line:
            proc.send_signal(signal.SIGTERM)
            break
    rest, _ = proc.communicate(timeout=120)
    output = "".join(lines) + rest
    assert proc.returncode == 143, output
    stopped = [l for l in output.splitlines() if "stopped at epoch" in l]
    assert len(stopped) == 1, output
    step = int(stopped[0].split(" step ")[1].split()[0])
    attempt = ws.read("attempts.json")[0]
    assert attempt["status"] == "interrupted"
    assert attempt["last_checkpoint"].endswith("ckpt-%d" % step) and step >= 16
    # the process's start on this clock (/proc tick resolution), and its imports as a phase
    assert launched - 1 <= attempt["process_started_at"] <= launched + 60
    assert 0 < attempt["startup_s"]["process"] < 120 and "start-up of this try: process " in output
    ckpt_dir = os.path.join(ws.run_dir(), "train", "checkpoints")
    assert tf.train.latest_checkpoint(ckpt_dir).endswith("ckpt-%d" % step), "nothing saved after the stop"
    reader = tf.train.load_checkpoint(os.path.join(ckpt_dir, "ckpt-%d" % step))
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == step
    assert not os.path.exists(os.path.join(ws.run_dir(), "train", "final"))
    result = train.run(ws.config("train", try_number=2, training={"epochs": step // 8 + 1}))
    assert result["resumed_from"]["step"] == step
    assert len(ws.read("attempts.json")) == 2


@pytest.mark.resume
@pytest.mark.parametrize("change", ["batch_size", "data"])
def test_changing_batch_size_or_data_between_tries_is_refused(ws, cli, change):
    """Both changes keep 8 steps per epoch, so only the recorded batch size and data set catch them."""
    prep.run(ws.config("prep"))
    first = train.run(ws.config("train", training={"epochs": 1}))
    assert first["steps_per_epoch"] == 8
    schema = ws.read("dataset.json")
    if change == "batch_size":
        training = {"epochs": 2, "batch_size": 31}
        counts = prep.run(ws.config("prep", try_number=2))
        assert counts["fingerprint"] == schema["fingerprint"]
        assert data.steps_per_epoch({"counts": {"train": counts["examples"]["train"]}}, 31) == 8
        expected = "training.batch_size: checkpoint"
    else:
        training = {"epochs": 2}
        write_blobs_csv(os.path.join(ws.data, "blobs.csv"), seed=1)  # same rows, other values
        counts = prep.run(ws.config("prep", try_number=2))
        assert counts["fingerprint"] != schema["fingerprint"]
        assert data.steps_per_epoch({"counts": {"train": counts["examples"]["train"]}}, 32) == 8
        expected = "data: checkpoint"
    proc = cli("train", ws.config("train", try_number=2, training=training))
    assert proc.returncode == contract.ExitCode.BAD_INPUT == 11, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert expected in proc.stderr and "Fix: " in proc.stderr and "start a new DAG run" in proc.stderr
    attempts = ws.read("attempts.json")
    assert len(attempts) == 1, "a refused try trains nothing and records no attempt"
    ckpt_dir = os.path.join(ws.run_dir(), "train", "checkpoints")
    assert tf.train.latest_checkpoint(ckpt_dir).endswith("ckpt-8")


def test_unknown_model_lists_the_valid_names(ws):
    prep.run(ws.config("prep"))
    with pytest.raises(BadInput) as info:
        train.run(ws.config("train", training={"model": "transformer"}))
    message = str(info.value)
    assert "'transformer'" in message and "cnn, mlp, resnet50" in message


def test_a_user_model_from_code_path(ws):
    _, model = write_user_model(ws.data, "mymodels")
    for run_id in (None, "r2", "r3"):
        prep.run(ws.config("prep", run_id=run_id))
    user = {"model": model, "code_path": "code", "epochs": 1,
            "model_kwargs": {"units": 6}}
    result = train.run(ws.config("train", training=user))
    assert result["steps"] == 8
    assert any(w.shape == (4, 6) for w in final_weights(ws).values())
    with pytest.raises(BadInput, match="model_kwargs"):
        train.run(ws.config("train", run_id="r2", training=dict(user, model_kwargs={"x": 1})))
    with pytest.raises(BadInput, match="cannot import module 'nope'"):
        train.run(ws.config("train", run_id="r3", training=dict(user, model="nope:build")))


def test_cnn_on_images_and_resnet50_builds(ws):
    write_image_folder(os.path.join(ws.data, "imgs"), per_class=20)
    data = {"format": "images", "path": "imgs", "image_size": [16, 16], "channels": 1,
            "eval_fraction": 0.25}
    prep.run(ws.config("prep", data=data))
    result = train.run(ws.config("train", data=data, training={
        "model": "cnn", "epochs": 4, "batch_size": 8, "model_kwargs": {"filters": [8]}}))
    assert ws.read("metrics.json")[-1]["val_accuracy"] >= 0.8, ws.read("metrics.json")
    assert result["steps"] == 4 * result["steps_per_epoch"]
    from trainer import config as config_mod, models
    schema = {"format": "images", "class_names": ["a", "b", "c"], "num_classes": 3,
              "image": {"height": 32, "width": 32, "channels": 3}}
    config = config_mod.resolve(ws.config("train", training={"model": "resnet50"}))
    model = models.build_model(config, schema, {})
    assert model.output_shape == (None, 3)
    assert model(np.zeros((1, 32, 32, 3), np.uint8)).dtype == tf.float32


@pytest.mark.resume
def test_mixed_precision_trains_and_resumes_with_the_loss_scale_optimizer(ws, monkeypatch):
    prep.run(ws.config("prep"))
    monkeypatch.setattr(checkpoints, "EAGER_SAVES", 1)  # the second save is traced: it must fall back
    mixed = {"mixed_precision": True, "checkpoint_every_steps": 5}
    try:
        first = train.run(ws.config("train", training=dict(mixed, epochs=1)))
        second = train.run(ws.config("train", try_number=2, training=dict(mixed, epochs=2)))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    assert first["steps"] == 8 and np.isfinite(first["final_loss"])
    assert second["resumed_from"]["step"] == 8 and second["steps"] == 16
    reader = tf.train.load_checkpoint(os.path.join(second["checkpoint_dir"], "ckpt-16"))
    names = list(reader.get_variable_to_shape_map())
    assert any("loss_scale" in n for n in names), names  # the LossScaleOptimizer state


@pytest.mark.gpu
def test_training_on_the_visible_gpus(ws, capsys):
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        pytest.skip("no GPU visible")
    prep.run(ws.config("prep"))
    try:
        result = train.run(ws.config("train", training={"epochs": 2, "mixed_precision": True}))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    out = capsys.readouterr().out
    assert "%d GPU(s)" % len(gpus) in out
    assert ("MirroredStrategy" in out) == (len(gpus) > 1)
    assert tf.config.experimental.get_memory_growth(gpus[0]) is True
    assert result["final_val_accuracy"] >= 0.9


def test_warm_start_initialises_from_the_newest_exported_version(trained, capsys):
    from trainer import evaluate, export

    evaluate.run(trained.config("evaluate"))
    export.run(trained.config("export"))
    for run_id in ("warm", "nowarm"):
        prep.run(trained.config("prep", run_id=run_id))
    capsys.readouterr()
    warm = train.run(trained.config("train", run_id="warm", training={
        "epochs": 1, "warm_start": True}))
    out = capsys.readouterr().out
    assert "warm start: model weights initialised from version 1" in out
    assert warm["warm_start"]["version"] == 1
    cold = trained.read("metrics.json")[0]["loss"]  # first epoch of the template's cold start
    assert trained.read("metrics.json", run_id="warm")[0]["loss"] < cold / 5
    assert trained.read("attempts.json", run_id="warm")[0]["warm_start"]["version"] == 1
    none = train.run(trained.config("train", run_id="nowarm", training={
        "epochs": 1, "warm_start": True}, export={"model_name": "other"}))
    assert none["warm_start"] is None
    assert "warm start: no exported version" in capsys.readouterr().out
    # the same three classes numbered otherwise: version 1's outputs would mean other classes
    other = {"classes": ["2", "1", "0"]}
    prep.run(trained.config("prep", run_id="renumbered", data=other))
    capsys.readouterr()
    renumbered = train.run(trained.config("train", run_id="renumbered", data=other, training={
        "epochs": 1, "warm_start": True}))
    assert renumbered["warm_start"] is None
    assert ("warm start: version 1 was trained on the classes ['0', '1', '2'], this data set has ['2', '1', '0']"
            in capsys.readouterr().out)
    assert trained.read("metrics.json", run_id="renumbered")[0]["loss"] > cold / 5


def test_training_and_eval_iterators_run_without_the_autotune_model_thread(ws, monkeypatch):
    """TF 2.9's autotune model thread sometimes held an iterator's deletion for up to 60 s (train
    stages idle 15-41 s after their last epoch); both iterators of a train stage are made from
    datasets with it off."""
    prep.run(ws.config("prep"))
    wrap, made = data.without_autotune_thread, []

    def spy(dataset):
        out = wrap(dataset)
        made.append(out.options().autotune.enabled)
        return out
    monkeypatch.setattr(data, "without_autotune_thread", spy)
    train.run(ws.config("train", training={"epochs": 1}))
    assert made == [False, False]  # the eval batches (built once), then the training batches


def test_the_attempts_record_of_a_checkpoint_is_renamed_into_place_without_an_fsync(ws, monkeypatch):
    """The per-checkpoint update of attempts.json skips the fsync (TensorFlow's own checkpoint is not
    fsynced either); the try's first record and its last are fsynced."""
    from trainer import atomic

    prep.run(ws.config("prep"))
    synced, writes = [], []
    real_fsync, real_write = os.fsync, atomic._write_file

    def fsync(fd):
        synced.append(fd)
        return real_fsync(fd)

    def write_file(path, write, binary=False, suffix="", durable=True):
        before = len(synced)
        real_write(path, write, binary=binary, suffix=suffix, durable=durable)
        if os.path.basename(path) == contract.ATTEMPTS_FILE:
            writes.append(len(synced) > before)  # whether this write reached the disk's cache flush

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(atomic, "_write_file", write_file)
    result = train.run(ws.config("train", training={"epochs": 2, "checkpoint_every_steps": 4}))
    assert result["steps"] == 16
    # the try's start, then one unsynced record per checkpoint (steps 4, 8, 12, 16), then its end
    assert writes[0] is True and writes[-1] is True, writes
    assert len(writes) >= 2 + 4 and not any(writes[1:-1]), writes


def test_only_the_newest_keep_checkpoints_stay_on_disk(ws):
    """The docs (Resume and recovery): a run's checkpoints are bounded by ``training.keep_checkpoints``: older ones are
    removed as newer ones are written, so months of runs do not fill the work volume."""
    prep.run(ws.config("prep"))
    # saves at steps 3, 6, 8 (epoch end), 9, 12, 15 and 16 (epoch end)
    train.run(ws.config("train", training={"epochs": 2, "checkpoint_every_steps": 3, "keep_checkpoints": 2}))
    ckpt_dir = os.path.join(ws.run_dir(), "train", "checkpoints")
    assert saved_steps(ckpt_dir) == [15, 16]
    assert not glob.glob(os.path.join(ckpt_dir, "ckpt-12.*")), "a removed checkpoint's data files go too"
