"""``icl-ssm run``: the whole method in one command, resumable stage by stage.

Stages, each recorded in ``OUT/stages/<name>.json`` (written atomically, keyed by the settings
that produced it, so a rerun skips what is already done and an interrupted run continues):

1. ``compressor`` - ``--compressor DIR`` if given; else the compressor shipped with the package
   for this model and task; else, with ``--distill``, a short ``icl-ssm distill`` into
   ``OUT/compressor`` (resumed if interrupted); else none (dense caches, the search unscreened);
2. ``fidelity`` - ``icl-ssm fidelity`` on held-out subsets, with the shipped control when there is
   one, and the fidelity verdict (:mod:`icl_ssm.evaluate.verdict`); skipped without a compressor, or
   when no method asked reads the verdict (:func:`uses_compressor`). What the selections score
   subsets on follows from it (:class:`~icl_ssm.pipeline.evaluator.EvaluatorChoice`);
3. ``select-<method>`` - the prompt search (``search``: screen, dense confirmation, order;
   :mod:`icl_ssm.select.search`), ``affinity`` on compressed caches, the baselines, and
   (``--dense-evaluator``) affinity on dense caches for the cost and quality comparison; each
   evaluated on the test split. The search runs last and screens the other methods' picks too;
4. ``check`` - every pick, zero-shot and random prompts on held-out examples, and the prompt to
   hand over (:mod:`icl_ssm.select.check`);
5. ``report`` - ``report.md``, ``report.json``, plots, ``selected.jsonl``, ``prompt.txt`` and
   ``selection.json`` (the prompt handed over, as ``icl-ssm answer`` loads it).

Imports every stage below it; only the command line imports it (``tests/test_layout.py``).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from icl_ssm import atomic
from icl_ssm.lm.models import load_model
from icl_ssm.lock import one_writer
from icl_ssm.pipeline.check import check_stage
from icl_ssm.pipeline.compressor import choose_compressor, fidelity_stage
from icl_ssm.pipeline.config import (
    DEFAULT_CALIBRATE,
    DEFAULT_METHODS,
    DEFAULT_SCREEN,
    QUICK,
    SEARCH_SCREENS,
    RunConfig,
    held_out_start,
    run_splits,
)
from icl_ssm.pipeline.context import Run
from icl_ssm.pipeline.evaluator import choose_evaluator
from icl_ssm.pipeline.methods import headroom_stage, search_config, selection_stages
from icl_ssm.pipeline.outputs import write_outputs
from icl_ssm.pipeline.stages import say
from icl_ssm.select.config import CALIBRATE

__all__ = ["CALIBRATE", "DEFAULT_CALIBRATE", "DEFAULT_METHODS", "DEFAULT_SCREEN", "QUICK", "SEARCH_SCREENS",
           "RunConfig", "held_out_start", "run_pipeline", "run_splits", "say", "search_config"]


def run_pipeline(cfg: RunConfig, out: str | Path) -> dict:
    """All stages; returns the report dict (also written to ``OUT/report.json``). One process at a
    time writes ``out`` (:func:`~icl_ssm.lock.one_writer`)."""
    cfg.validate()
    out = atomic.prepare_dir(out)
    with one_writer(out, "icl-ssm run", say=say):
        return _run_pipeline(cfg, out)


def _run_pipeline(cfg: RunConfig, out: Path) -> dict:
    """The stages in order, each handed the :class:`~icl_ssm.pipeline.context.Run` resolved once."""
    run = Run.open(cfg, out)
    atomic.write_json(out / "run_config.json", asdict(cfg))
    comp = choose_compressor(run)  # a distillation loads its own model, and frees it, before the run's is loaded
    run = run.with_model(*load_model(cfg.model))
    fidelity = fidelity_stage(run, comp)
    verdict = choose_evaluator(cfg, fidelity, unused=comp.source == "unused")
    compressor = comp.load(run.model.config)
    room = headroom_stage(run)
    selections = selection_stages(run, cfg.select_config(comp.compressor), verdict, compressor, room)
    check = check_stage(run, selections)
    return write_outputs(run, comp, fidelity, selections, check, verdict, room)
