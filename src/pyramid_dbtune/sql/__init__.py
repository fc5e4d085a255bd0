"""SQL methods: named statements, and what they read, write and return.

``.sql`` and ``.zsql`` files, what a statement reads and writes, and the
rows it returns.
"""
