"""``report``: the results of one run as files a person wants to look at.

:func:`~icl_ssm.report.write.write_report` turns the JSON-serialisable result dict of a run into
``report.md``, ``report.json`` (the dict plus the plot names) and PNG plots drawn with
:class:`matplotlib.figure.Figure` (no pyplot, so no global state and no display):

- ``report.md``: the prompt handed over and what the hand-over check found (headline first), the
  fidelity verdict, one row per selection method, the checked prompts, the prompt search, the
  fidelity of the compressed cache, the plots, and the pool indices of what was handed over;
- ``accuracy.png``: which prompt is best on the test split, against the random prompts' spread
  and zero-shot;
- ``cost.png``: what each method's accuracy cost, in seconds and in FLOPs.

Every file is written atomically, the plots first and ``report.json`` last, so a ``report.json``
on disk means the whole report is there. Missing or ``None`` values read "—"; FLOPs that were not
counted read "n/a".

The modules, in the order the result dict flows through them: :mod:`.values` (what is where in
the dict, and how a value reads), :mod:`.search` (the prompt search's section), :mod:`.markdown`
(``report.md`` and the lines the CLI prints), :mod:`.figures` (the plots), :mod:`.write` (the files).

Imports only ``icl_ssm.apply`` and the layers below it; never the pipeline or the command line
(``tests/test_layout.py``)."""
