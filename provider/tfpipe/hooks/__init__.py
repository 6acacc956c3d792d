"""Hooks of the tfpipe provider: :mod:`tfpipe.hooks.docker` (the engine) and :mod:`tfpipe.hooks.gcs` (Cloud Storage)."""
