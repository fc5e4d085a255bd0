"""Deployment: gunicorn, fork safety and the ``dbtune`` command.

gunicorn's settings and hooks (:mod:`.gunicorn`), what a fork renews, and
the command's ``threadcheck`` and ``triggers``.
"""
