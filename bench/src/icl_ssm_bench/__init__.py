"""The measurements behind BENCHMARKS.md and the paper's in-context regression study, kept out of
the library a user installs (``icl_ssm``): each harness here drives the library's public stages
and writes a record; nothing in ``icl_ssm`` imports this package. ``icl-ssm bench ...`` and
``icl-ssm synthetic ...`` reach it through the ``icl_ssm.commands`` entry points
(``bench/pyproject.toml``).

- ``scan``, ``spectrum``, ``shapes``, ``scale*``, ``length``, ``long_context``, ``answer``: cost and
  fidelity at scale;
- ``selection`` and ``select_*``, ``estimators``, ``headroom``, ``calibration``: the selection
  harnesses;
- ``search``, ``calibrate_equal_time``, ``trust``: the pre-registered experiments over whole runs;
- ``synthetic``: the regression teacher, its task, distillation and selection;
- ``cli``: the two commands' flags.
"""
