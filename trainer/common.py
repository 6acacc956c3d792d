"""Helpers shared by the stages: logging, the stage preamble, the run's dataset, TF setup.

Only :func:`setup_tensorflow` and :func:`quiet_tensorflow` touch TensorFlow, and they import it
lazily, so this module stays importable without TF.
"""

import datetime
import logging
import os
import sys
import time

from trainer import atomic, config as config_mod, contract
from trainer.errors import BadInput

LOG = logging.getLogger("tfpipe")


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is at emit time (so pytest's capture sees it)."""

    def __init__(self):
        super(_StdoutHandler, self).__init__(sys.stdout)

    def emit(self, record):
        self.stream = sys.stdout
        super(_StdoutHandler, self).emit(record)


def setup_logging():
    """Plain one-line logs on stdout: ``2026-11-29 18:00:00 INFO message``."""
    if not any(isinstance(h, _StdoutHandler) for h in LOG.handlers):
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s",
                                               "%Y-%m-%d %H:%M:%S"))
        LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
    LOG.propagate = False  # absl may configure the root logger: no duplicate lines


class Progress(object):
    """Progress of a long phase as plain log lines: ``prep: read 12000/50000 lines (24%)``.

    :meth:`add` logs at most one line every :attr:`every_s` seconds, so short phases stay
    silent; :meth:`finish` adds a closing line only when a progress line was logged. One
    complete line each, never a carriage return (Airflow task logs are line based).
    """

    every_s = 5.0

    def __init__(self, what, total, unit, scale=1, clock=time.monotonic):
        self.what, self.total, self.unit, self.scale = what, total, unit, scale
        self.done = 0
        self.lines = 0
        self._clock = clock
        self._last = clock()

    def add(self, count=1):
        """Count ``count`` more units; log a line when ``every_s`` passed since the last one."""
        self.done += count
        now = self._clock()
        if now - self._last >= self.every_s:
            self._last = now
            self._log()

    def finish(self):
        """Log the final count if this phase logged progress before."""
        if self.lines:
            self._log()

    def _log(self):
        self.lines += 1
        percent = 100.0 * self.done / self.total if self.total else 100.0
        if self.scale == 1:
            counts = "%d/%d" % (self.done, self.total)
        else:
            counts = "%.1f/%.1f" % (self.done / float(self.scale), self.total / float(self.scale))
        LOG.info("%s %s %s (%d%%)", self.what, counts, self.unit, min(100, int(percent)))


def quiet_tensorflow():
    """Lower TensorFlow's C++ log noise to errors; call before TF is imported.

    ``TFPIPE_TF_LOG_LEVEL`` (0-3) overrides it, e.g. 0 to see CUDA library loading on a GPU host.
    """
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = os.environ.get("TFPIPE_TF_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def now_iso():
    """The current UTC time as an ISO 8601 string."""
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def begin(config, stage):
    """Resolve and validate ``config``, write it to ``<run_dir>/config/<stage>.json`` (a sweep
    trial's to ``<run_dir>/trials/trial-<k>/config/``, so trials at once never overwrite each other's).

    Returns the resolved config. Every stage calls this before doing any work.
    """
    setup_logging()
    resolved = config_mod.resolve(config)
    resolved["stage"] = stage
    record_dir = contract.training_dir(resolved["paths"]["run_dir"], config_mod.trial_index(resolved))
    atomic.write_json(contract.stage_config_path(record_dir, stage), resolved)
    LOG.info("stage %s: dag %s run %s try %s", stage, resolved["run"]["dag_id"],
             resolved["run"]["run_id"], resolved["run"]["try_number"])
    LOG.info("process: malloc %s, time zone %s (%s), %s CPUs", allocator(),
             os.environ.get("TZ", "unset"), time.strftime("%Z %z"), cpu_limit() or "all")
    return resolved


def describe_params(params):
    """``learning_rate=0.01, model_kwargs.units=64``: a sweep trial's settings, sorted, for logs."""
    return ", ".join("%s=%s" % (name, params[name]) for name in sorted(params)) or "no settings"


def allocator():
    """``jemalloc`` when it is loaded into this process (the image preloads it), else ``glibc``."""
    try:
        with open("/proc/self/maps") as f:
            return "jemalloc" if "libjemalloc" in f.read() else "glibc"
    except OSError:
        return "unknown"


def cpu_limit():
    """The container's CPU limit (cgroup v1 CFS quota / period, or v2 cpu.max), or None."""
    for path, parse in (("/sys/fs/cgroup/cpu.max", lambda t: t.split()),
                        ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", None)):
        try:
            with open(path) as f:
                text = f.read()
            if parse:
                quota, period = parse(text)
            else:
                with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
                    quota, period = text.strip(), f.read().strip()
            if quota not in ("max", "-1"):
                return round(int(quota) / float(int(period)), 2)
            return None
        except (OSError, ValueError):
            continue
    return None


def memory_limit():
    """Bytes this container may use: its cgroup memory limit (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``), or the machine's memory when there is none."""
    limits = []
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))  # v1 writes "no limit" as a huge number: min() drops it
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    return min(limits) if limits else None


def rss_bytes():
    """This process's resident set size now, in bytes (None where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss():
    """Start a new peak-RSS window for this process (Linux ``clear_refs`` 5 resets VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb():
    """This process's peak resident set size in MiB since start or :func:`reset_peak_rss`.

    Recorded per epoch, so memory that creeps up over a long run (malloc fragmentation) shows
    in ``metrics.json`` as a rising ``rss_peak_mb``.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024.0, 1)
    except OSError:
        pass
    return None


def process_started_at():
    """The wall-clock time (epoch seconds) this process started, from ``/proc``; None without it.

    ``/proc/uptime`` is the host's in a container too, as is the boot-relative start time in
    ``/proc/self/stat``, so the result is on the host's clock: a runner can subtract the moment
    it launched the container to get the container's own start-up.
    """
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    start_ticks = int(after_name[19])  # field 22 of stat(5); the fields after the name start at 3
    return time.time() - uptime + start_ticks / float(os.sysconf("SC_CLK_TCK"))


def datasets_root(config):
    """``<work>/datasets``: prep outputs shared by all runs."""
    return os.path.join(config["paths"]["work"], "datasets")


def model_root(config):
    """``<models>/<model_name>``: the integer versions of the exported model."""
    return os.path.join(config["paths"]["models"], config["export"]["model_name"])


def load_dataset(config):
    """Return ``(dataset_dir, schema, stats)`` of the data set this run's prep chose."""
    run_dir = config["paths"]["run_dir"]
    pointer_path = os.path.join(run_dir, "dataset.json")
    pointer = atomic.read_json(pointer_path)
    if pointer is None:
        raise BadInput("%s does not exist: run the prep stage of this run first" % pointer_path)
    # The fingerprint, not the recorded path, locates the data set: the volume may be mounted
    # elsewhere than when prep ran.
    dataset_dir = os.path.join(datasets_root(config), pointer["fingerprint"])
    if not os.path.exists(os.path.join(dataset_dir, "_SUCCESS")):
        raise BadInput("data set %s named by %s is missing or incomplete (no _SUCCESS)"
                       % (dataset_dir, pointer_path))
    schema = atomic.read_json(os.path.join(dataset_dir, "schema.json"))
    stats = atomic.read_json(os.path.join(dataset_dir, "stats.json"))
    return dataset_dir, schema, stats


def trained_settings(config):
    """``config`` with the ``training`` section the run's final weights were trained with.

    After a sweep's select stage (``selection.json`` in the run dir) the final weights are the chosen
    trial's, trained with its settings (a layer's width, the batch size, ...), while a later stage's
    config holds the DAG's; select promoted the trial's recorded train config to
    ``config/train.json`` with its weights. Without a selection: ``config`` itself.
    """
    run_dir = config["paths"]["run_dir"]
    selection = atomic.read_json(os.path.join(run_dir, contract.SELECTION_FILE))
    if not selection:
        return config
    chosen = selection["chosen"]["index"]
    recorded_path = contract.stage_config_path(run_dir, "train")
    recorded = atomic.read_json(recorded_path) or {}
    if (recorded.get(contract.TRIAL_KEY) or {}).get("index") != chosen:
        raise BadInput("%s: is not the config of trial %d, which %s chose. Fix: clear the select task so "
                       "that it promotes its choice again." % (recorded_path, chosen, contract.SELECTION_FILE))
    LOG.info("sweep: the final weights are trial %d's (%s): its training settings apply", chosen,
             describe_params(selection["chosen"]["params"]))
    return dict(config, training=recorded["training"])


def list_versions(root):
    """The integer version numbers under a model root, ascending (``.tmp-*`` never count)."""
    if not os.path.isdir(root):
        return []
    versions = []
    for name in os.listdir(root):
        if name.isdigit() and os.path.isdir(os.path.join(root, name)):
            versions.append(int(name))
    return sorted(versions)


def read_version_metadata(root, version):
    """``metadata.json`` of one version, or None when it has none (or it is unreadable)."""
    try:
        return atomic.read_json(os.path.join(root, str(version), "metadata.json"))
    except ValueError:
        LOG.warning("ignoring unreadable %s/%s/metadata.json", root, version)
        return None


def version_class_names(metadata):
    """The class names a version was trained on (its ``metadata.json`` ``data.class_names``), or
    None when its metadata predates them or is missing."""
    names = ((metadata or {}).get("data") or {}).get("class_names")
    return None if names is None else list(names)


def setup_tensorflow(training):
    """Seeds, GPU memory growth, mixed precision; return the ``tf.distribute`` strategy.

    ``MirroredStrategy`` when more than one GPU is visible, else the default strategy.
    """
    quiet_tensorflow()
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    try:
        from absl import logging as absl_logging
        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:
        pass
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        try:
            if not tf.config.experimental.get_memory_growth(gpu):
                tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError as error:  # already initialised in this process
            LOG.warning("cannot set memory growth on %s: %s", gpu.name, error)
    tf.keras.utils.set_random_seed(training["seed"])
    policy = "mixed_float16" if training["mixed_precision"] else "float32"
    tf.keras.mixed_precision.set_global_policy(policy)
    if len(gpus) > 1:
        strategy = tf.distribute.MirroredStrategy()
    else:
        strategy = tf.distribute.get_strategy()
    LOG.info("tensorflow %s, %d GPU(s), strategy %s, %d replica(s), policy %s",
             tf.__version__, len(gpus), type(strategy).__name__.strip("_"),
             strategy.num_replicas_in_sync, policy)
    return strategy
