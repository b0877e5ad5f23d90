"""The readers of the records stored before the record schema, one module per family of records.

A module here defines its readers (``reader(raw, name) -> Record``: the stored JSON and its name under
``docs/results/``) and ``FAMILIES``, a dict from the start of its records' names to its reader.
:mod:`claim_tables.adapt` gathers every module's ``FAMILIES``; two modules naming the same start, or one
start that begins another, is refused. Shared pieces (a stored bootstrap as a metric) are in :mod:`.common`.
"""
