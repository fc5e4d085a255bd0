"""Routing: each read to a reader, each write to the writer.

The writer and reader engines, the unit of work joined to the request's
transaction, ``request.sql`` and the ORM session.
"""
