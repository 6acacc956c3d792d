"""Hooks of the tfpipe provider.

- :mod:`tfpipe.hooks.docker`: helper containers and archives on the Docker engine;
- :mod:`tfpipe.hooks.gcs`: Google Cloud Storage client and credentials (``google-cloud-storage``).
"""
