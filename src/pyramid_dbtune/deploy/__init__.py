"""Deployment: gunicorn's settings and hooks, fork safety, and the
``dbtune`` command."""
