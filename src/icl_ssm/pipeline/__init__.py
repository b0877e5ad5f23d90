"""``icl-ssm run``: the whole method in one command, resumable stage by stage.

Stages, each recorded in ``OUT/stages/<name>.json`` (written atomically, keyed by the settings
that produced it, so a rerun skips what is already done and an interrupted run continues):

1. ``compressor`` - ``--compressor DIR`` if given; else the compressor shipped with the package
   for this model and task; else, with ``--distill``, a short ``icl-ssm distill`` into
   ``OUT/compressor`` (resumed if interrupted); else none (dense caches, the search unscreened);
2. ``fidelity`` - ``icl-ssm fidelity`` on held-out subsets, with the shipped control when there is
   one, and the fidelity verdict (:mod:`icl_ssm.evaluate.verdict`); skipped without a compressor, or
   when no method asked reads the verdict (:func:`uses_compressor`);
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

from dataclasses import asdict, replace
from pathlib import Path

from icl_ssm import atomic
from icl_ssm.compress.compressor import load_compressor
from icl_ssm.data.splits import label_warning
from icl_ssm.data.tasks import get_task
from icl_ssm.lm.models import load_model
from icl_ssm.lock import one_writer
from icl_ssm.pipeline.check import check_stage
from icl_ssm.pipeline.compressor import choose_evaluator, fidelity_stage, resolve_compressor, uses_compressor
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
from icl_ssm.pipeline.methods import equal_cost_stage, headroom_stage, quick_selection, search_config
from icl_ssm.pipeline.outputs import write_outputs
from icl_ssm.pipeline.stages import Stages, say, stage_bar, stage_key
from icl_ssm.select.base import Hooks
from icl_ssm.select.config import CALIBRATE, EVALUATED, SelectConfig
from icl_ssm.select.run import select_demonstrations

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
    task = get_task(cfg.task, **cfg.task_options)
    splits = run_splits(cfg, task)
    for note in (splits.note, *task.notes(), label_warning(splits.pool, task.labels if task.kind == "classification"
                                                                  else ())):
        if note:
            say(note)
    if cfg.k > len(splits.pool):
        raise ValueError(f"--k {cfg.k} demonstrations requested but the pool of task {task.name!r} has only "
                         f"{len(splits.pool)} candidates; lower --k or raise --pool-size")
    stages = Stages(out)
    atomic.write_json(out / "run_config.json", asdict(cfg))
    comp = resolve_compressor(cfg, out, stages)
    if comp["compressor"] is not None and not uses_compressor(cfg):
        say(f"the {comp['source']} compressor is not used and its fidelity not measured: no method asked reads "
            "it (affinity, bridge, or --screen auto or compressed)")
        comp = {"compressor": None, "control": None, "source": "unused"}

    fidelity = None if comp["compressor"] is None else fidelity_stage(cfg, comp, stages)
    verdict = choose_evaluator(cfg, fidelity, unused=comp["source"] == "unused")
    model, tokenizer = load_model(cfg.model)
    compressor = None if comp["compressor"] is None else load_compressor(comp["compressor"], model.config)
    base = SelectConfig(model=cfg.model, task=cfg.task, k=cfg.k, compressor=comp["compressor"],
                        estimator=cfg.estimator, subsets=cfg.subsets, queries=cfg.queries, test_size=cfg.test_size,
                        pool_size=cfg.pool_size, seed=cfg.seed, batch=cfg.batch, query_batch=cfg.query_batch,
                        per_label=cfg.per_label, order=cfg.order, task_options=cfg.task_options,
                        budget=cfg.budget, target_reliability=cfg.target_reliability, test_orders=cfg.test_orders)
    runs = [(m, replace(base, method=m, stratify=cfg.stratify and m == "affinity")) for m in cfg.methods
            if m != "search"]
    runs = [(m, replace(s, evaluator=verdict["evaluator"]) if m in EVALUATED else s) for m, s in runs]
    if cfg.dense_evaluator and "affinity" in cfg.methods and verdict["evaluator"] == "compressed":
        at = next(i for i, (m, _) in enumerate(runs) if m == "affinity") + 1
        runs.insert(at, ("affinity-dense", replace(base, method="affinity", evaluator="dense", stratify=cfg.stratify)))
    selections: dict[str, dict] = {}
    room = headroom_stage(cfg, stages, splits, model, tokenizer)
    if room is not None and not room["search"]:  # a calibrated random prompt, at once, instead of a search
        selections[QUICK] = quick_selection(cfg, room, splits, model, tokenizer)
    elif "search" in cfg.methods:  # last: the other methods' picks are among the prompts it screens
        runs.append(("search", None))
    for name, scfg in runs:
        if name == "search":
            scfg = search_config(cfg, base, verdict, selections)
        key = stage_key([asdict(scfg), comp["compressor"]])
        result = stages.get(f"select-{name}", key)
        if result is None:
            with stage_bar(f"select {name}", "subsets") as (on_start, advance):
                hooks = Hooks(lambda line, n=name: say(f"select {n}: {line}"), advance, on_start)
                selection, summary, pool = select_demonstrations(scfg, model, tokenizer, compressor, splits=splits,
                                                                 hooks=hooks)
            summary["scores"] = [None if s != s else float(s) for s in selection.scores.tolist()]
            result = stages.put(f"select-{name}", key, summary)
        else:
            say(f"select {name}: done before, skipped")
        selections[name] = result
    if cfg.equal_cost and "affinity-dense" in selections and verdict["evaluator"] == "compressed":
        selections["affinity-equal-cost"] = equal_cost_stage(cfg, stages, base, selections["affinity-dense"],
                                                             splits, model, tokenizer, compressor, comp)
    check = check_stage(cfg, stages, selections, splits, model, tokenizer)
    return write_outputs(cfg, out, comp, fidelity, selections, splits, model, tokenizer, check, verdict, room)
