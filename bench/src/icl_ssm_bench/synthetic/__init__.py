"""The paper's in-context regression study: a regression teacher (``teacher``, a transformers
model with a KV cache) on clustered linear or non-linear tasks (``task``), its compressor
distilled through the library's distillation (``distill``), selection on its caches (``select``)
and the study's runs and tables (``study``)."""
