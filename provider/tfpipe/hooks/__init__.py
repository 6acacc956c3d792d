"""Hooks of the tfpipe provider.

- :mod:`tfpipe.hooks.gcs`: Google Cloud Storage client and credentials (``google-cloud-storage``).
"""
