"""The image's CUDA 11 runtime is complete: every library TF 2.9 opens loads, dependencies and all.

Without a GPU, TF stops at the driver (``libcuda.so.1``, which the NVIDIA Container Toolkit mounts
from the host) before it opens the math libraries, so each soname TF's loader asks for is opened
here with ctypes (``dlopen`` with ``RTLD_NOW``: every dependency and every symbol must resolve),
one fresh process per library so none rides on another's already-loaded dependencies. TF's own
start-up log must then name nothing but the driver as missing. What a GPU host adds (the driver,
kernels actually running) is checked by ``scripts/gpu-check.sh``.

On the CPU variant (``TFPIPE_IMAGE_VARIANT=cpu``) the same tests assert the opposite: no CUDA.
"""

import base64
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys

import pytest

# What TF 2.9's stream_executor/platform/default/dso_loader.cc opens for its CUDA 11.2 build
# (TF_CUDART_VERSION 11.0, cuBLAS 11, cuFFT 10, cuRAND 10, cuSOLVER 11, cuSPARSE 11, cuDNN 8).
# TensorRT's libnvinfer.so.7 is optional (TF-TRT only) and no package index wheel carries it.
TF_SONAMES = ["libcudart.so.11.0", "libcublas.so.11", "libcublasLt.so.11", "libcufft.so.10",
              "libcurand.so.10", "libcusolver.so.11", "libcusparse.so.11", "libcudnn.so.8"]
# libcudnn.so.8 is a small dispatcher that opens these when a kernel family is first used.
CUDNN_PARTS = ["libcudnn_ops_infer.so.8", "libcudnn_ops_train.so.8", "libcudnn_cnn_infer.so.8",
               "libcudnn_cnn_train.so.8", "libcudnn_adv_infer.so.8", "libcudnn_adv_train.so.8"]
# NCCL, for multi-GPU all-reduce (tf.distribute.MirroredStrategy's NcclAllReduce).
OTHER = ["libnccl.so.2"]
DRIVER = "libcuda.so.1"

ROOT_INFO = json.load(open("/opt/tfpipe/root-image.json"))
GPU_VARIANT = ROOT_INFO.get("variant", "gpu") == "gpu"


def wheel_version(name):
    """The installed version of NVIDIA's wheel ``name``, or None: the build drops the CUDA wheels
    on the official root, which brings its own CUDA 11.2 and cuDNN 8.1."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


CUDA_WHEELS = wheel_version("nvidia-cuda-runtime-cu11") is not None

_LOAD = r"""
import ctypes, json, sys
name = sys.argv[1]
try:
    ctypes.CDLL(name)  # ctypes always adds RTLD_NOW: unresolved symbols fail here
except OSError as err:
    print(json.dumps({"ok": False, "error": str(err)}))
else:
    maps = open("/proc/self/maps").read().split()
    path = next((p for p in maps if p.endswith("/" + name) or "/" + name + "." in p), None)
    print(json.dumps({"ok": True, "path": path}))
"""


def load_alone(soname, env=None):
    """dlopen ``soname`` by bare name in a fresh interpreter (``env`` added to its environment);
    return ``{"ok", "path"|"error"}``."""
    proc = subprocess.run([sys.executable, "-c", _LOAD, soname], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=120,
                          env=dict(os.environ, **(env or {})))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def tf_startup_log():
    """TF's full C++ log of an import plus a GPU device query, as on any stage's start."""
    # dso_loader logs each successful dlopen at VLOG(1): turn that on for that one file.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="dso_loader=1")
    probe = ("import tensorflow as tf; print('GPUS', tf.config.list_physical_devices('GPU')); "
             "print('MAPPED', sorted(set(l.split()[-1] for l in open('/proc/self/maps') if 'libcudart' in l)))")
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout
    return proc.stdout


def driver_present():
    return load_alone(DRIVER)["ok"]


@pytest.mark.parametrize("soname", TF_SONAMES + CUDNN_PARTS + OTHER)
def test_library_loads_with_all_dependencies(soname):
    result = load_alone(soname)
    if GPU_VARIANT:
        assert result["ok"], "%s does not load: %s" % (soname, result.get("error"))
        # Found through ld.so's search path (the image's ld.so.conf.d entry or the root's CUDA).
        assert result["path"], "%s loaded but is not in /proc/self/maps" % soname
    else:
        assert not result["ok"], "the cpu variant should carry no CUDA, but %s loads from %s" % (
            soname, result.get("path"))


@pytest.mark.parametrize("soname", TF_SONAMES + CUDNN_PARTS + OTHER)
def test_library_is_found_whatever_ld_library_path_says(soname, tmp_path):
    # A user who sets LD_LIBRARY_PATH replaces whatever the image might have put there (as a
    # loader path): here it names only an empty directory and one that does not exist.
    hostile = {"LD_LIBRARY_PATH": os.pathsep.join([str(tmp_path), "/nonexistent/lib64"])}
    result = load_alone(soname, env=hostile)
    if not GPU_VARIANT:
        assert not result["ok"], "the cpu variant should carry no CUDA, but %s loads from %s" % (
            soname, result.get("path"))
        return
    assert result["ok"], "%s does not load with LD_LIBRARY_PATH=%s: %s" % (
        soname, hostile["LD_LIBRARY_PATH"], result.get("error"))
    assert result["path"] == load_alone(soname)["path"]
    if CUDA_WHEELS:  # found through /etc/ld.so.conf.d/tfpipe-cuda.conf
        assert result["path"].startswith("/opt/tfpipe/deps/nvidia/"), result["path"]


def test_tensorflow_build_matches_the_sonames():
    # The sonames above follow from the CUDA/cuDNN versions TF was built with.
    import tensorflow as tf

    info = tf.sysconfig.get_build_info()
    assert info["is_cuda_build"] is True
    assert info["cuda_version"] == "11.2" and info["cudnn_version"] == "8", info


def test_tensorflow_is_the_pinned_2_9_3():
    import tensorflow as tf

    assert tf.__version__ == "2.9.3"


# Left out on purpose (the docs' image page, "GPU-ready offline"): libraries TF 2.9 never opens, TensorRT, CUPTI
# and NVRTC. None may be anywhere in the offline image's file system; the official root brings its
# own CUDA 11.2 (with CUPTI), so there only tfpipe's own tree is checked.
LEFT_OUT = re.compile(r"^lib(cusolverMg|cufftw|nvblas|OpenCL|nvinfer|nvinfer_plugin|cupti|nvrtc)\.so")


def test_the_libraries_left_out_on_purpose_are_not_in_the_image():
    found = []
    for top in ("/opt", "/usr", "/lib") if ROOT_INFO["kind"] == "offline" else ("/opt/tfpipe",):
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
            found += [os.path.join(folder, f) for f in files if LEFT_OUT.match(f)]
    assert found == []


def test_library_versions_fit_tf_2_9():
    if not GPU_VARIANT:
        assert not load_alone("libcudnn.so.8")["ok"]
        return
    import ctypes

    # Version queries that need no driver (cudaRuntimeGetVersion does: see
    # test_cuda_runtime_is_11_8_or_the_official_roots_11_2).
    cudnn = ctypes.CDLL("libcudnn.so.8")
    cudnn.cudnnGetVersion.restype = ctypes.c_size_t
    version = cudnn.cudnnGetVersion()  # e.g. 8500 for 8.5.0
    assert 8100 <= version < 9000, "TF 2.9 needs cuDNN 8 with minor >= 1, found %d" % version
    if CUDA_WHEELS:
        assert 8500 <= version < 8600, "the image's cuDNN wheel should be 8.5, found %d" % version
        assert wheel_version("nvidia-cudnn-cu11").startswith("8.5.")
    else:
        assert 8100 <= version < 8200, "the official root's cuDNN should be 8.1, found %d" % version
    cublaslt = ctypes.CDLL("libcublasLt.so.11")
    cublaslt.cublasLtGetVersion.restype = ctypes.c_size_t
    assert 110000 <= cublaslt.cublasLtGetVersion() < 120000


_RUNTIME_VERSION = r"""
import ctypes, json
version = ctypes.c_int(-1)
code = ctypes.CDLL("libcudart.so.11.0").cudaRuntimeGetVersion(ctypes.byref(version))
print(json.dumps([code, version.value]))
"""


def sha256_record(path):
    """The file's hash as a wheel's RECORD writes it (urlsafe base64, no padding)."""
    with open(path, "rb") as handle:
        digest = hashlib.sha256(handle.read()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_cuda_runtime_is_11_8_or_the_official_roots_11_2():
    loaded = load_alone("libcudart.so.11.0")
    if not GPU_VARIANT:
        assert not loaded["ok"]
        return
    assert loaded["ok"], loaded.get("error")
    path = os.path.realpath(loaded["path"])
    if CUDA_WHEELS:
        # The runtime tells its version only once a driver answers, so without a GPU the proof
        # is the file itself: the one ld.so loads is, byte for byte, the 11.8 wheel's.
        dist = importlib.metadata.distribution("nvidia-cuda-runtime-cu11")
        assert dist.version.startswith("11.8."), dist.version
        entry = next(f for f in dist.files if f.name == "libcudart.so.11.0")
        assert os.path.realpath(str(entry.locate())) == path
        assert (entry.hash.mode, entry.hash.value) == ("sha256", sha256_record(path))
        expected = 11080
    else:
        # The official root's toolkit names the real file by its full version.
        assert re.search(r"/libcudart\.so\.11\.2\.\d+$", path), path
        expected = 11020
    proc = subprocess.run([sys.executable, "-c", _RUNTIME_VERSION], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    code, version = json.loads(proc.stdout)
    if driver_present():
        assert (code, version) == (0, expected)
    else:
        assert code == 35, (code, version)  # cudaErrorInsufficientDriver: no driver to ask


def test_tensorflow_startup_misses_only_the_driver():
    log = tf_startup_log()
    missing = set(re.findall(r"Could not load dynamic library '([^']+)'", log))
    if not GPU_VARIANT:
        assert "libcudart.so.11.0" in missing, log
        return
    assert "Successfully opened dynamic library libcudart.so.11.0" in log, log
    assert re.search(r"MAPPED \[.*/libcudart\.so\.11\.0'\]", log), log
    if driver_present():
        # A GPU host with the NVIDIA Container Toolkit: nothing may be missing.
        assert missing == set(), log
    else:
        assert missing == {DRIVER}, "without a GPU only the driver may be missing:\n" + log
        assert "GPUS []" in log


def test_no_driver_in_the_image():
    # The driver must come from the host (it has to match the kernel module); a copy baked into
    # the image would shadow it. The toolkit mounts it at container start, never at build.
    deps = "/opt/tfpipe/deps"
    found = [os.path.join(d, f) for d, _, files in os.walk(deps) for f in files
             if f.startswith("libcuda.so") or f.startswith("libnvidia-")]
    assert found == []
