"""tfpipe's Airflow plugin: the run report and TensorBoard under the api-server, the run note.

Registered through the ``airflow.plugins`` entry point of the distribution (see
:mod:`tfpipe.plugins.tfpipe`). Modules here import Airflow's api-server code only when the
api-server first serves a request, so loading the plugin in a worker or the DAG processor stays
cheap.
"""
