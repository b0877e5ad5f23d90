"""How far a compressed cache stands in for the dense prompt: answers after a prefix cache
(:mod:`.answers`, batched, packed and reference paths tested equal; multi-token label scores
through the labels' trie in :mod:`.label_trie`), the fidelity run over held-out subsets and
cache paths (:mod:`.paths`, :mod:`.fidelity`, :mod:`.fidelity_report`, :mod:`.dense_store`),
its statistics (:mod:`.stats`) and the verdict that decides whether selection trusts the
compressed caches (:mod:`.verdict`).

Imports only ``icl_ssm.distill`` and the layers below it; never selection, the pipeline or the
command line (``tests/test_layout.py``)."""
