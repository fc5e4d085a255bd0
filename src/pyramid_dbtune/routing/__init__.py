"""Reads and writes: the writer and reader engines, the unit of work joined
to the request's transaction, ``request.sql`` and the ORM session."""
