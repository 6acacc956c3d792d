# Dependency layer of the trainer image: the root image plus the locked wheels.
#
# ROOT_IMAGE is either the official tensorflow/tensorflow:2.9.3-gpu (Ubuntu 20.04, Python 3.8,
# CUDA 11.2, cuDNN 8.1) or the offline bullseye rootfs (Python 3.9) that build-image.sh imports.
# The build context is a wheelhouse downloaded on the host for the root image's Python, so the
# install needs no network. The wheels are installed in a throw-away stage and only the installed
# tree is copied over, so the 570 MB of wheels never become an image layer.
ARG ROOT_IMAGE
FROM ${ROOT_IMAGE} AS install
LABEL io.tfpipe.stage=install
COPY requirements.lock /tmp/requirements.lock
COPY wheels/ /tmp/wheels/
RUN python3 -m pip install --no-cache-dir --no-index --find-links /tmp/wheels \
        --target /opt/tfpipe/deps -r /tmp/requirements.lock \
    && python3 -m compileall -q /opt/tfpipe/deps >/dev/null || true

FROM ${ROOT_IMAGE}
COPY --from=install /opt/tfpipe/deps /opt/tfpipe/deps
# PYTHONPATH puts the locked packages ahead of anything the root image ships (the official image
# has its own TF install): the same Python packages run on both roots; only OS and CUDA differ.
ENV PYTHONPATH=/opt/tfpipe/deps \
    PATH=/opt/tfpipe/deps/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TF_CPP_MIN_LOG_LEVEL=1
RUN python3 -c "import tensorflow as tf, numpy, google.protobuf as pb; \
print('tensorflow', tf.__version__, 'numpy', numpy.__version__, 'protobuf', pb.__version__)"
