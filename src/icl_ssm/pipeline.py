"""``icl-ssm run``: the whole method in one command, resumable stage by stage.

Stages, each recorded in ``OUT/stages/<name>.json`` (written atomically, keyed by the settings
that produced it, so a rerun skips what is already done and an interrupted run continues):

1. ``compressor`` - ``--compressor DIR`` if given; else one already trained in ``OUT/compressor``;
   else the compressor shipped with the package for this model and task; else a short
   ``icl-ssm distill`` into ``OUT/compressor`` (resumed if interrupted);
2. ``fidelity`` - ``icl-ssm fidelity`` on held-out subsets, with the shipped control when there is one;
3. ``select-<method>`` - ``affinity`` on compressed caches, the baselines, and (``--dense-evaluator``)
   affinity on dense caches for the cost and quality comparison; each evaluated on the test split;
4. ``report`` - ``report.md``, ``report.json``, plots, ``selected.jsonl`` and ``prompt.txt``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from icl_ssm import atomic
from icl_ssm import prompts as P
from icl_ssm import tasks as T
from icl_ssm.compressor import find_pretrained, load_compressor
from icl_ssm.distill import DistillConfig
from icl_ssm.fidelity import FidelityConfig, run_fidelity
from icl_ssm.models import DEFAULT_MODEL, load_model
from icl_ssm.select_cli import ORDERS, SelectConfig, select_demonstrations, selected_rows

METHODS = ("affinity", "random", "bm25", "topk")


@dataclass
class RunConfig:
    """Everything ``icl-ssm run`` was asked; the defaults are sized for ``make demo``."""

    model: str = DEFAULT_MODEL
    task: str = "rotten_tomatoes"
    k: int = 20
    seed: int = 0
    compressor: str | None = None  # a trained compressor directory; default: shipped or distilled
    control: str | None = None  # a control compressor (prompt-independent) for the fidelity comparison
    distill: bool = False  # distil even when a shipped compressor matches
    distill_samples: int = 64
    distill_epochs: float = 1.0
    state_size: int = 256  # compressor shape, when distilling
    num_virtual: int = 16
    num_sink: int = 4
    latent_size: int = 128
    num_recent: int = 16  # the gated hybrid (BENCHMARKS.md, run G): exact recent tokens + gated virtual tokens
    gate: bool = True
    pool_size: int = 100
    queries: int = 8  # validation queries per subset
    test_size: int = 150
    subsets: int | None = None  # affinity budget; default n / (k eps^2)
    estimator: str = "mean"
    per_label: bool = False  # every method's k places shared out over the labels (select --per-label)
    stratify: bool = False  # affinity's subsets drawn with the labels in even shares (select --stratify)
    order: str = "score"  # prompt order of every method's chosen demonstrations (select --order)
    methods: tuple[str, ...] = METHODS
    dense_evaluator: bool = True  # also run affinity on dense caches (cost and quality beside)
    fidelity_subsets: int = 30
    fidelity_queries: int = 4
    batch: int = 8
    query_batch: int = 32

    def check(self) -> None:
        unknown = [m for m in self.methods if m not in ("affinity", "random", "bm25", "topk", "gradce")]
        if unknown:
            raise ValueError(f"--methods {unknown}: accepted: affinity, random, bm25, topk, gradce")
        if self.k < 1:
            raise ValueError(f"--k {self.k}: expected >= 1 demonstrations")
        if self.fidelity_subsets < 2:
            raise ValueError(f"--fidelity-subsets {self.fidelity_subsets}: a rank correlation needs >= 2 subsets")


# ----------------------------------------------------------------------------- stages


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Stages:
    """``OUT/stages/<name>.json``: a stage's result and the key of the settings behind it."""

    def __init__(self, out: Path):
        self.dir = out / "stages"
        self.dir.mkdir(parents=True, exist_ok=True)

    def get(self, name: str, key: str) -> dict | None:
        path = self.dir / f"{name}.json"
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return record["result"] if record.get("key") == key else None

    def put(self, name: str, key: str, result: dict) -> dict:
        atomic.write_json(self.dir / f"{name}.json", {"key": key, "result": result})
        return result


@contextmanager
def stage_bar(description: str, unit: str) -> Iterator[tuple[Callable[[int], None], Callable[[int], None]]]:
    """A progress bar for one stage: ``(on_start(total), advance(n))``; a line per update in logs."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    with Progress(TextColumn(f"[bold]{description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                  TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(), console=console) as bar:
        job = bar.add_task(description, total=None)

        def advance(n: int) -> None:
            bar.advance(job, n)
            if not console.is_terminal:
                t = bar.tasks[0]
                console.print(f"{description}: {int(t.completed)}/{int(t.total or 0)} {unit}, {t.elapsed or 0:.0f} s")

        yield (lambda total: bar.update(job, total=total or None)), advance
        total = bar.tasks[0].total or 1  # a stage without steps (a baseline) shows as one finished step
        bar.update(job, total=total, completed=total)


def say(message: str) -> None:
    print(f"icl-ssm run: {message}", file=sys.stderr, flush=True)


def resolve_compressor(cfg: RunConfig, out: Path, stages: Stages) -> dict:
    """Stage 1: which compressor (and control) to use; distils one when none is available."""
    if cfg.compressor:
        load_compressor(cfg.compressor)  # a clear error now rather than after the other stages
        return {"compressor": str(Path(cfg.compressor).resolve()), "control": cfg.control, "source": "given"}
    shipped = None if cfg.distill else find_pretrained(cfg.model, cfg.task, cfg.k)
    if shipped is not None:
        control = shipped / "control"
        recipe = json.loads((shipped / "recipe.json").read_text())
        say(f"using the compressor shipped for {cfg.model} / {cfg.task} ({shipped.name}, trained at k={recipe['k']})")
        return {"compressor": str(shipped / "compressor"), "control": cfg.control or
                (str(control) if control.is_dir() else None), "source": "shipped", "recipe": recipe}
    dcfg = DistillConfig(model=cfg.model, tasks=(cfg.task,), k=cfg.k, samples=cfg.distill_samples,
                         seed=cfg.seed, state_size=cfg.state_size, num_virtual=cfg.num_virtual,
                         num_sink=cfg.num_sink, latent_size=cfg.latent_size, num_recent=cfg.num_recent,
                         gate=cfg.gate, stage1_epochs=cfg.distill_epochs, stage2_epochs=cfg.distill_epochs)
    key = _key(asdict(dcfg))
    done = stages.get("compressor", key)
    if done is not None and (Path(done["compressor"]) / "model.safetensors").exists():
        return done
    from icl_ssm.distill_cli import distill_args, run_distill

    target = out / "compressor"
    say(f"distilling a compressor into {target} ({cfg.distill_samples} subsets; --compressor DIR skips this)")
    resume = (target / "checkpoint").exists()
    code = run_distill(distill_args(dcfg, target, resume=resume))
    if code != 0:
        raise RuntimeError(f"distillation into {target} failed (exit {code}); rerun to resume")
    return stages.put("compressor", key, {"compressor": str(target), "control": cfg.control, "source": "distilled",
                                          "distill": asdict(dcfg)})


def run_pipeline(cfg: RunConfig, out: str | Path) -> dict:
    """All stages; returns the report dict (also written to ``OUT/report.json``)."""
    cfg.check()
    out = atomic.prepare_dir(out)
    task = T.get_task(cfg.task)
    splits = T.split(task, pool_size=cfg.pool_size, seed=cfg.seed)
    if cfg.k > len(splits.pool):
        raise ValueError(f"--k {cfg.k} demonstrations requested but the pool of task {task.name!r} has only "
                         f"{len(splits.pool)} candidates; lower --k or raise --pool-size")
    stages = Stages(out)
    atomic.write_json(out / "run_config.json", asdict(cfg))
    comp = resolve_compressor(cfg, out, stages)

    fcfg = FidelityConfig(model=cfg.model, task=cfg.task, k=cfg.k, compressor=comp["compressor"],
                          control=comp.get("control"), subsets=cfg.fidelity_subsets, queries=cfg.fidelity_queries,
                          seed=cfg.seed, batch=cfg.batch, query_batch=cfg.query_batch)
    key = _key([asdict(fcfg), comp])
    fidelity = stages.get("fidelity", key)
    if fidelity is None:
        with stage_bar("fidelity", "subsets") as (on_start, advance):
            fidelity = run_fidelity(fcfg, on_start=on_start, progress=advance)
        fidelity = stages.put("fidelity", key, fidelity)
    else:
        say("fidelity: done before, skipped")

    model, tokenizer = load_model(cfg.model)
    compressor = load_compressor(comp["compressor"], model.config)
    base = SelectConfig(model=cfg.model, task=cfg.task, k=cfg.k, compressor=comp["compressor"],
                        estimator=cfg.estimator, subsets=cfg.subsets, queries=cfg.queries, test_size=cfg.test_size,
                        pool_size=cfg.pool_size, seed=cfg.seed, batch=cfg.batch, query_batch=cfg.query_batch,
                        per_label=cfg.per_label, order=cfg.order)
    runs = [(m, replace(base, method=m, stratify=cfg.stratify and m == "affinity")) for m in cfg.methods]
    if cfg.dense_evaluator and "affinity" in cfg.methods:
        runs.insert(1, ("affinity-dense", replace(base, method="affinity", evaluator="dense", stratify=cfg.stratify)))
    selections: dict[str, dict] = {}
    for name, scfg in runs:
        key = _key([asdict(scfg), comp["compressor"]])
        result = stages.get(f"select-{name}", key)
        if result is None:
            with stage_bar(f"select {name}", "subsets") as (on_start, advance):
                selection, summary, pool = select_demonstrations(scfg, model, tokenizer, compressor, splits=splits,
                                                                 on_start=on_start, progress=advance)
            summary["scores"] = [None if s != s else float(s) for s in selection.scores.tolist()]
            result = stages.put(f"select-{name}", key, summary)
        else:
            say(f"select {name}: done before, skipped")
        selections[name] = result
    return write_outputs(cfg, out, comp, fidelity, selections, splits, model, tokenizer)


def write_outputs(cfg: RunConfig, out: Path, comp: dict, fidelity: dict, selections: dict[str, dict],
                  splits: T.Splits, model, tokenizer) -> dict:
    """selected.jsonl + prompt.txt (the affinity choice, else the first method's) and the report."""
    from icl_ssm.report import write_report

    chosen = selections.get("affinity") or next(iter(selections.values()))
    pool = splits.pool
    scores = chosen.get("scores") or [None] * len(pool)
    atomic.write_jsonl(out / "selected.jsonl", selected_rows(pool, chosen["indices"], scores))
    builder = P.PromptBuilder.for_model(model, tokenizer, T.get_task(cfg.task))
    atomic.write_text(out / "prompt.txt", builder.build_prefix([pool[i] for i in chosen["indices"]]).text)
    dense = selections.get("affinity-dense")
    rows = []
    for name, s in selections.items():
        if name == "affinity-dense":
            continue
        row = {key: s.get(key) for key in ("method", "evaluator", "test_accuracy", "flops", "wall_seconds",
                                           "subsets", "indices")}
        if name == "affinity" and dense is not None:
            row.update(dense_flops=dense["flops"], dense_wall_seconds=dense["wall_seconds"],
                       dense_test_accuracy=dense["test_accuracy"])
        rows.append(row)
    if dense is not None:
        rows.insert(1, {key: dense.get(key) for key in ("evaluator", "test_accuracy", "flops", "wall_seconds",
                                                        "subsets", "indices")} | {"method": "affinity (dense)"})
    report = {
        "model": cfg.model, "task": cfg.task, "k": cfg.k, "seed": cfg.seed,
        "compressor": comp, "fidelity": {k: v for k, v in fidelity.items() if k not in ("config", "argv")},
        "selections": rows,
        "affinity_scores": selections["affinity"]["scores"] if "affinity" in selections else None,
        "selected": chosen["indices"], "prompt_file": "prompt.txt", "selected_file": "selected.jsonl",
        "pool_size": len(pool), "run_config": asdict(cfg),
    }
    write_report(out, report)
    return report


def _main(args: argparse.Namespace) -> int:
    cfg = RunConfig(**{f: getattr(args, f) for f in RunConfig.__dataclass_fields__})
    cfg.methods = tuple(cfg.methods)
    report = run_pipeline(cfg, args.out)
    best = max(report["selections"], key=lambda r: r["test_accuracy"] or 0.0)
    say(f"best test accuracy {best['test_accuracy']:.3f} ({best['method']}); report: {Path(args.out) / 'report.md'}")
    print(Path(args.out) / "report.md")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="the whole pipeline: compressor, fidelity, selection, baselines, report",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = RunConfig()
    p.add_argument("--model", default=d.model, help="embedded name, hub id or local directory")
    p.add_argument("--task", default=d.task, help="task name, or a .jsonl/.csv file of your own")
    p.add_argument("--k", type=int, default=d.k, help="demonstrations to choose")
    p.add_argument("--out", default="icl-ssm-run", help="directory for the report and every stage's results")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--compressor", default=d.compressor, help="a trained compressor directory to use")
    p.add_argument("--control", default=d.control, help="a control compressor directory for the fidelity table")
    p.add_argument("--distill", action="store_true", help="distil a compressor even if one is shipped")
    p.add_argument("--distill-samples", type=int, default=d.distill_samples, help="training subsets when distilling")
    p.add_argument("--distill-epochs", type=float, default=d.distill_epochs, help="epochs of each stage")
    for name in ("state_size", "num_virtual", "num_sink", "latent_size", "num_recent"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name),
                       help="compressor shape when distilling")
    p.add_argument("--gate", action=argparse.BooleanOptionalAction, default=d.gate,
                   help="when distilling: gated virtual tokens beside the exact recent tokens")
    p.add_argument("--pool-size", type=int, default=d.pool_size, help="candidates to select from")
    p.add_argument("--queries", type=int, default=d.queries, help="validation queries per subset")
    p.add_argument("--test-size", type=int, default=d.test_size, help="test examples per evaluation")
    p.add_argument("--subsets", type=int, default=d.subsets, help="affinity subsets (default n / (k eps^2))")
    p.add_argument("--estimator", default=d.estimator, choices=("mean", "ridge"))
    p.add_argument("--per-label", action="store_true",
                   help="every method: the k places shared out evenly over the pool's labels (select --per-label)")
    p.add_argument("--stratify", action="store_true",
                   help="affinity: every subset drawn with the pool's labels in even shares, the k chosen with the "
                        "same shares (select --stratify)")
    p.add_argument("--order", default=d.order, choices=ORDERS,
                   help="prompt order of every method's chosen demonstrations (select --order)")
    p.add_argument("--methods", nargs="+", default=list(d.methods), help="selection methods to compare")
    p.add_argument("--dense-evaluator", action=argparse.BooleanOptionalAction, default=d.dense_evaluator,
                   help="also run affinity on dense caches")
    p.add_argument("--fidelity-subsets", type=int, default=d.fidelity_subsets)
    p.add_argument("--fidelity-queries", type=int, default=d.fidelity_queries)
    p.add_argument("--batch", type=int, default=d.batch, help="subsets encoded together")
    p.add_argument("--query-batch", type=int, default=d.query_batch, help="(subset, query) pairs answered together")
    p.set_defaults(func=_main)
