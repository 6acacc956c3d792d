"""The project's own deployment scripts: ``make up``/``down``/``status`` (stack.py) and a REST client (rest.py)."""
