"""The published tables, one module per area, each rendered as markdown from the records under ``docs/results/``.

``tools/claims.py`` is the entry point: it holds the reader and its checks, the registry of which table goes
into which markdown file, and the check and write of the committed text. A renderer takes the reader
(:class:`.base.Records`) and returns its table's markdown. The modules here never import ``tools/claims.py``;
what they share is in :mod:`.base`.
"""
