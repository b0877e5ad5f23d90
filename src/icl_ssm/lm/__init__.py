"""The language model and its prompts: one loader for every causal LM (:mod:`.models`, GGUF files
through :mod:`.gguf`, tiny random test models in :mod:`.tiny`, what the compressor can serve in
:mod:`.support`), prompts of demonstrations with exact token spans and their answers
(:mod:`.answer_format`, :mod:`.prompts`, :mod:`.chat`, :mod:`.batch`), and scoring and generation
with or without a prefix cache (continuation log-probabilities in :mod:`.logprobs`, label scores
and the answer loss in :mod:`.scoring`, greedy generation in :mod:`.generation`, the prefix in
:mod:`.prefix`, the transformers forward and Cache API in :mod:`.hf`).

Imports only ``icl_ssm.data`` and the top-level helpers; never the SSM, the compressor or
anything built on them (``tests/test_layout.py``)."""
