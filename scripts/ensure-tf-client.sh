#!/usr/bin/env bash
# Make sure .cache/tf-client is a venv holding exactly requirements/tf-client.lock: a current
# TensorFlow that the export tests load the trainer image's SavedModels in, as a user's own serving
# code would (tests/tf_client.py). See scripts/ensure-locked-venv.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/ensure-locked-venv.sh" tf-client tensorflow-cpu 'tensorflow[-_]cpu' \
  'import tensorflow as tf; print(tf.__version__)'
