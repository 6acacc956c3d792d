"""tfpipe's Airflow plugin: the run report and TensorBoard under the api-server, the run note.

Api-server code is imported only on the first request, so loading the plugin elsewhere stays light.
"""
