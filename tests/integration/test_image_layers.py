"""The trainer image's installed dependencies come in several layers, none of them huge.

The docs' image page: the 4.3 GB dependency tree is five layers of at most about 1.3 GB, so that `docker
push` compresses several at once and a pull downloads several at once. Read from the engine's
history of the image `make image` built (what a registry push sends, layer by layer).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

#: The largest layer the docs allow (bytes, as `docker history` counts them).
MAX_LAYER = 1.3e9


def test_the_dependency_tree_is_split_into_layers_of_at_most_1_3_gb(trainer_image, docker_client):
    image = docker_client.images.get(trainer_image)
    history = image.history()
    # every COPY but the trainer's code is deps.Dockerfile's (the legacy builder's history names
    # a copy's target, "in /", not its source)
    deps_layers = [h["Size"] for h in history
                   if "COPY" in (h.get("CreatedBy") or "") and "/opt/tfpipe/app" not in h["CreatedBy"]]
    largest = max(h["Size"] for h in history)
    assert largest <= MAX_LAYER, [(h["Size"], h["CreatedBy"][:120]) for h in history]
    # The official root has its own CUDA: the install stage drops the wheels there, and the three
    # CUDA layers are empty.
    if image.labels.get("io.tfpipe.variant") == "gpu" and image.labels.get("io.tfpipe.root.kind") == "offline":
        # cuDNN, cuBLAS, the other CUDA libraries, TensorFlow and the rest: five copies, the
        # smallest of them still hundreds of megabytes (a split that moved nothing fails here)
        assert len(deps_layers) >= 5, deps_layers
        assert sorted(deps_layers)[-5] >= 2e8, deps_layers
        assert sum(deps_layers) >= 4e9, deps_layers
