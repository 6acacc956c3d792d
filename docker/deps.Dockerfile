# Dependency layer of the trainer image: the root image plus the locked wheels (TF 2.9 and, in
# the default GPU variant, NVIDIA's CUDA 11 runtime wheels), jemalloc and the time zone database.
#
# ROOT_IMAGE is either the official tensorflow/tensorflow:2.9.3-gpu (Ubuntu 20.04, Python 3.8,
# CUDA 11.2, cuDNN 8.1) or the offline bullseye rootfs (Python 3.9) that build-image.sh imports.
# The build context is a wheelhouse downloaded on the host for the root image's Python, so the
# install needs no network. The wheels are installed in a throw-away stage and only the installed
# tree (plus a small overlay: ld.so config, jemalloc/tzdata where the root lacks them) is copied
# over, so the wheels themselves (2.3 GB with CUDA) never become an image layer.
ARG ROOT_IMAGE
FROM ${ROOT_IMAGE} AS install
LABEL io.tfpipe.stage=install
COPY requirements.lock finish-deps.sh /tmp/
COPY wheels/ /tmp/wheels/
COPY debs/ /tmp/debs/
RUN python3 -m pip install --no-cache-dir --no-index --find-links /tmp/wheels \
        --target /opt/tfpipe/deps -r /tmp/requirements.lock \
    && (python3 -m compileall -q /opt/tfpipe/deps >/dev/null || true) \
    && sh /tmp/finish-deps.sh
# The installed tree (4.3 GB with CUDA) as five image layers of at most about 1.3 GB, not one:
# `docker push` gzips each layer on one core and sends up to five at once, and a GPU host's pull
# downloads three at once, so one big layer made the registry round trip of the deployment a
# single-core job. Each group moves out of the tree to a root of its own (empty in the CPU
# variant, where there is no nvidia/), and the final stage copies the roots back in order.
RUN set -eu; cd /opt/tfpipe; \
    for group in cudnn:nvidia/cudnn cublas:nvidia/cublas cuda:nvidia tensorflow:tensorflow; do \
      root="layers/${group%%:*}/opt/tfpipe/deps"; path="${group#*:}"; \
      mkdir -p "$root"; \
      if [ -e "deps/$path" ]; then mkdir -p "$root/$(dirname "$path")" && mv "deps/$path" "$root/$path"; fi; \
    done

FROM ${ROOT_IMAGE}
COPY --from=install /opt/tfpipe/layers/cudnn/ /
COPY --from=install /opt/tfpipe/layers/cublas/ /
COPY --from=install /opt/tfpipe/layers/cuda/ /
COPY --from=install /opt/tfpipe/layers/tensorflow/ /
COPY --from=install /opt/tfpipe/deps /opt/tfpipe/deps
COPY --from=install /opt/tfpipe/overlay/ /
# PYTHONPATH puts the locked packages ahead of anything the root image ships (the official image
# has its own TF install): the same Python packages run on both roots; only OS and CUDA differ.
# jemalloc replaces glibc malloc in every process: glibc's per-thread arenas fragment over long
# TF runs and the RSS creeps up epoch after epoch (see `make bench`, rss_drift_ratio). A stage
# turns it off with resources.jemalloc: false (the operator then sets LD_PRELOAD to "").
ENV PYTHONPATH=/opt/tfpipe/deps \
    PATH=/opt/tfpipe/deps/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TF_CPP_MIN_LOG_LEVEL=1 \
    TZ=UTC \
    MPLCONFIGDIR=/opt/tfpipe/matplotlib \
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
# Where the image came from, for the provenance in every exported model's metadata.json.
ARG ROOT_KIND=unknown
ARG ROOT_REF=unknown
ARG ROOT_ID=unknown
ARG ROOT_DIGEST=
ARG VARIANT=gpu
LABEL io.tfpipe.root.kind="${ROOT_KIND}" \
      io.tfpipe.root.reference="${ROOT_REF}" \
      io.tfpipe.root.id="${ROOT_ID}" \
      io.tfpipe.root.repo-digest="${ROOT_DIGEST}" \
      io.tfpipe.variant="${VARIANT}"
# matplotlib's font list is built here, once: without it every evaluate stage scanned the fonts
# again (about 0.25 s of its run, in a fresh container each time). The directory is writable by
# any --user (each container has its own copy), because matplotlib only uses a writable one.
RUN ldconfig \
    && mkdir -m 1777 /opt/tfpipe/matplotlib \
    && python3 -c "import matplotlib.font_manager" \
    && test -s /opt/tfpipe/matplotlib/fontlist-v*.json \
    && printf '{"kind": "%s", "reference": "%s", "id": "%s", "repo_digest": "%s", "variant": "%s"}\n' \
        "$ROOT_KIND" "$ROOT_REF" "$ROOT_ID" "$ROOT_DIGEST" "$VARIANT" >/opt/tfpipe/root-image.json \
    && python3 -c "import tensorflow as tf, numpy, google.protobuf as pb; \
assert 'libjemalloc' in open('/proc/self/maps').read(), 'jemalloc is not preloaded'; \
print('tensorflow', tf.__version__, 'numpy', numpy.__version__, 'protobuf', pb.__version__, 'jemalloc ok')"
