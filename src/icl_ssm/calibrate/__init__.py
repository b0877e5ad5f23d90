"""Calibration of label scores: a per-label bias, estimated once and subtracted from every
answer's label log-probabilities, so that a prompt's lean towards one label is not mistaken for
what its demonstrations teach.

A :class:`~icl_ssm.calibrate.base.Calibrator` says which inputs its bias is estimated on and
how (:meth:`~icl_ssm.calibrate.base.Calibrator.fit`); :func:`~icl_ssm.calibrate.base.estimate`
runs it on a scorer and returns a :class:`~icl_ssm.calibrate.base.Calibration`, the saved bias
that :meth:`~icl_ssm.calibrate.base.Calibration.apply` subtracts. One file per method:

* ``none`` (:mod:`.base`): the raw scores;
* ``batch`` (:mod:`.batch`): the mean label log-probability over a batch of unlabelled inputs
  (batch calibration, Zhou et al., ICLR 2024);
* ``contextual`` (:mod:`.contextual`): content-free inputs ("N/A", "", "[MASK]"; Zhao et al., 2021);
* ``domain`` (:mod:`.domain`): random strings of in-domain words (Fei et al., ACL 2023);
* ``fitted`` (:mod:`.fitted`): the bias that minimises the cross-entropy on labelled examples.

Classification tasks only. Imports only torch, numpy and :mod:`icl_ssm.data`.

Imports only ``icl_ssm.lm``, ``icl_ssm.data`` and the top-level helpers; never the SSM, caches,
selection or the command line (``tests/test_layout.py``)."""

from icl_ssm.calibrate import batch, contextual, domain, fitted  # noqa: F401  (each module registers its method)
from icl_ssm.calibrate.base import CALIBRATORS, NONE, Calibration, Calibrator, estimate, get_calibrator, no_calibration

__all__ = ["CALIBRATORS", "NONE", "Calibration", "Calibrator", "estimate", "get_calibrator", "no_calibration"]
