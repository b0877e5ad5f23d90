"""Distillation (the paper's Algorithm 1): one episode's targets from the frozen teacher
(:mod:`.targets`), computed once for every episode and stored (:mod:`.teacher`) under the spec
they depend on (:mod:`.spec`), the losses
(:mod:`.losses`), the two-stage training (:mod:`.train`) with its checkpoints
(:mod:`.checkpoint`), a run's config and named recipes (:mod:`.config`) and the run end to end
(:mod:`.run`, ``icl-ssm distill``).

Imports only ``icl_ssm.compress`` and the layers below it; never evaluation, selection or the
command line (``tests/test_layout.py``)."""
