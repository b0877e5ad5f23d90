"""The state space model the compressor reads prompts with: HiPPO-LegS transitions and their
discretisations (:mod:`.hippo`), the scans over token embeddings with their reference, paper and
fast forms side by side and tested equal (:mod:`.scan`, :mod:`.legs`, inputs checked once in
:mod:`.inputs`, the fast scan's powers of the frozen transition cached in :mod:`.powers`),
products of neighbouring tokens (:mod:`.products`) and the layer the compressor holds
(:mod:`.layer`).

Imports nothing of ``icl_ssm`` outside itself (torch and numpy only): the compressor and
everything above build on it, never the reverse (``tests/test_layout.py``)."""
