"""Demonstration selection: the :class:`~icl_ssm.select.base.Selector` contract and its registry
(:data:`~icl_ssm.select.base.SELECTORS`), subset sampling, affinity estimators, subset
evaluators (:mod:`.subset_losses`), Algorithm 2 (:mod:`.affinity`), one module per baseline, the
prompt search (:mod:`.search`), the select stage (:mod:`.stage`) and the chosen prompt scored on
held-out examples (:mod:`.held_out`).

Importing this package registers every selector.

Imports only ``icl_ssm.evaluate`` and the layers below it; never answering, the report, the
pipeline or the command line (``tests/test_layout.py``)."""

from icl_ssm.select import affinity, bm25, bridge, gradce, random_k, search, topk  # noqa: F401  (each module registers its selector)
