"""SQL methods: named statements, ``.sql`` and ``.zsql`` files, what a
statement reads and writes, and the rows it returns."""
