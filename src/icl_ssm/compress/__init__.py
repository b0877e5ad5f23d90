"""The compressed cache: the SSM compressor (the paper's Section 3.1, :mod:`.compressor`) and its
shape declared once (:mod:`.shape`), the compressors shipped with the package
(:mod:`.pretrained`), the cache builders every stage is handed (:mod:`.builders`, one class per
file), the prefix caches they build (:mod:`.cache`, every contact with the transformers Cache
API beside :mod:`icl_ssm.lm.hf`), many short suffixes read after one prefix row (:mod:`.packed`),
the same-size long-context baselines (:mod:`.baselines`), generation after a prefix
(:mod:`.generate`) and one query answered from a compressed cache beside the dense prompt
(:mod:`.side_by_side`).

Imports only ``icl_ssm.ssm`` and the layers below it (``calibrate``, ``lm``, ``data`` and the
top-level helpers); never distillation, evaluation, selection or the command line
(``tests/test_layout.py``)."""
