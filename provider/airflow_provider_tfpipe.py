"""The module Airflow guesses for this distribution when it looks for providers' example DAGs.

Without it, Airflow 3.3 logs a traceback in every process that loads DAG bundles; being a module, it
has no ``example_dags`` folder. tfpipe's code is :mod:`tfpipe`.
"""
