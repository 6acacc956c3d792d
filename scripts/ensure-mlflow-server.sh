#!/usr/bin/env bash
# Make sure .cache/mlflow-server is a venv holding exactly requirements/mlflow-server.lock: the MLflow
# tracking server that `make up` runs beside Airflow (deploy/stack.py) and the MLflow tests start. The
# full mlflow package (Flask, SQLAlchemy, alembic, pandas) stays out of Airflow's venv, whose own pins
# it would fight. See scripts/ensure-locked-venv.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/ensure-locked-venv.sh" mlflow-server mlflow mlflow \
  'import mlflow, mlflow.server, psycopg2; print(mlflow.__version__)'
