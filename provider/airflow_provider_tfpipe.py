"""The module Airflow guesses for this distribution when it looks for providers' example DAGs.

With ``[core] load_examples`` on (Airflow's default), Airflow 3.3 adds the ``example_dags`` folder of
every installed provider as a DAG bundle, and finds a provider's package from its distribution name:
``apache-airflow-providers-foo`` as ``airflow.providers.foo``, any other name with its dashes made
underscores (apache/airflow#66305 tracks replacing that guess). For ``airflow-provider-tfpipe`` the
guess is this module; without it, each process that loads the DAG bundles (the DAG processor and
``tfpipe run`` among them) logged an error with a traceback. It is a module, not a package, so it has
no ``example_dags`` folder, which is what Airflow then concludes. tfpipe's code is :mod:`tfpipe`.
"""
