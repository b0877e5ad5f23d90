"""Applying a selection: answering inputs with the chosen prompt (its prefix encoded once and
shared), writing the predictions resumably, and exporting the demonstrations to other tools.

Imports only ``icl_ssm.select`` and the layers below it; never the report, the pipeline or the
command line (``tests/test_layout.py``)."""
