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
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from icl_ssm import atomic
from icl_ssm.calibrate import Calibration, no_calibration
from icl_ssm.compress.compressor import load_compressor
from icl_ssm.compress.pretrained import find_pretrained
from icl_ssm.data.splits import Splits, label_warning, split
from icl_ssm.data.tasks import get_task
from icl_ssm.distill.config import DistillConfig
from icl_ssm.distill.run import train_compressor
from icl_ssm.evaluate.fidelity import FidelityConfig, run_fidelity
from icl_ssm.evaluate.verdict import VERDICT_EVALUATORS, failed_checks, fidelity_verdict
from icl_ssm.lm.models import DEFAULT_MODEL, load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.lock import one_writer
from icl_ssm.select.base import SELECTORS
from icl_ssm.select.check import CALIBRATED, ZERO_SHOT, check_prompts, hand_over
from icl_ssm.select.evaluate import calibrate_prompt, evaluate_calibrated, evaluate_selection
from icl_ssm.select.evaluators import RELIABILITY_TARGET
from icl_ssm.select.headroom import HEADROOM_PROMPTS, MIN_RELIABILITY, can_add, measure_headroom
from icl_ssm.select.run import CALIBRATE, EVALUATED, SelectConfig, select_demonstrations, selected_rows
from icl_ssm.select.selected import SelectedPrompt, compressor_fidelity, pool_spec

DEFAULT_METHODS = ("search", "affinity", "random", "bm25", "topk")
SEARCH_SCREENS = ("auto", "compressed", "dense", "none")  # auto: compressed unless the fidelity verdict is dense
# the default screen, chosen by the pre-registered equal-time experiment's rule (``bench search``):
# no screen was shown to beat random search over whole prompts (docs/research/prompt-search.md)
DEFAULT_SCREEN = "none"
# by the pre-registered equal-time rule and the mapping committed before its results (docs/research/calibration.md)
DEFAULT_CALIBRATE = "search"
QUICK = "calibrated-random"  # the prompt handed over without a search where the headroom says none can add
_RECIPE = DistillConfig()  # the compressor shape distilled when none is shipped: the measured recipe's


@dataclass
class RunConfig:
    """Everything ``icl-ssm run`` was asked; the defaults are sized for ``make demo``."""

    model: str = DEFAULT_MODEL
    task: str = "rotten_tomatoes"
    k: int = 20
    seed: int = 0
    compressor: str | None = None  # a trained compressor directory; default: shipped or distilled
    control: str | None = None  # a control compressor (prompt-independent) for the fidelity comparison
    distill: bool = False  # distil a compressor first (even when one is shipped; without one, run uses dense caches)
    distill_samples: int = 64
    distill_epochs: float = 1.0
    state_size: int = _RECIPE.state_size
    num_virtual: int = _RECIPE.num_virtual
    num_sink: int = _RECIPE.num_sink
    latent_size: int = _RECIPE.latent_size
    num_recent: int = _RECIPE.num_recent
    gate: bool = _RECIPE.gate
    pool_size: int = 100
    queries: int = 8  # validation queries per subset
    test_size: int = 150
    test_orders: int = 0  # further random orders of every chosen set scored on the test split
    subsets: int | None = None  # affinity budget; default n / (k eps^2)
    budget: float | None = None  # minutes per affinity run, sized to target_reliability (select --budget)
    target_reliability: float = RELIABILITY_TARGET
    estimator: str = "mean"
    per_label: bool = False  # every method's k places shared out over the labels (select --per-label)
    stratify: bool = False  # affinity's subsets drawn with the labels in even shares (select --stratify)
    order: str = "score"  # prompt order of every method's chosen demonstrations (select --order)
    methods: tuple[str, ...] = DEFAULT_METHODS
    dense_evaluator: bool = True  # also run affinity on dense caches (cost and quality beside)
    equal_cost: bool = False  # with dense_evaluator: affinity on compressed caches given the dense run's time
    evaluator: str = "auto"  # affinity: auto (compressed unless the fidelity verdict fails them), compressed or dense
    max_accuracy_drop: float = 0.05  # the fidelity verdict: accuracy the compressed caches may lose to the dense prompt
    search_minutes: float = 2.0  # the prompt search's wall time (screen + confirm + order)
    screen: str = DEFAULT_SCREEN  # the search's screen: SEARCH_SCREENS
    screen_queries: int = 32  # label-balanced validation queries of the screen
    confirm_queries: int = 64  # validation queries of the search's last successive-halving rung
    check_size: int = 128  # held-out validation examples the check scores every prompt on
    random_prompts: int = 8  # random k-prompts the chosen prompt is checked against
    keep_selection: bool = False  # hand over the method's pick even when it does not beat random prompts
    calibrate: str = DEFAULT_CALIBRATE  # CALIBRATE: the label-score calibration selected and handed over
    headroom: bool = True  # with a calibration: search only where validation can rank calibrated prompts
    fidelity_subsets: int = 30
    fidelity_queries: int = 4
    batch: int = 8
    query_batch: int = 32
    task_options: dict[str, Any] = field(default_factory=dict)  # get_task's options (-o KEY=VALUE, --skip-empty)

    def validate(self) -> None:
        unknown = [m for m in self.methods if m not in SELECTORS]
        if unknown:
            raise ValueError(f"--methods {unknown}: accepted: {', '.join(SELECTORS)}")
        if self.k < 1:
            raise ValueError(f"--k {self.k}: expected >= 1 demonstrations")
        for name in ("pool_size", "queries", "test_size", "batch", "query_batch", "fidelity_queries"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected >= 1")
        if self.seed < 0 or self.test_orders < 0:
            raise ValueError(f"--seed {self.seed}, --test-orders {self.test_orders}: expected integers >= 0")
        if self.random_prompts < 1 or self.check_size < 1:
            raise ValueError(f"--random-prompts {self.random_prompts}, --check-size {self.check_size}: expected >= 1")
        if self.evaluator not in VERDICT_EVALUATORS:
            raise ValueError(f"--evaluator {self.evaluator!r}; accepted: {', '.join(VERDICT_EVALUATORS)}")
        if not 0 <= self.max_accuracy_drop < 1:
            raise ValueError(f"--max-accuracy-drop {self.max_accuracy_drop}: expected a share in [0, 1)")
        if self.calibrate not in CALIBRATE:
            raise ValueError(f"--calibrate {self.calibrate!r}; accepted: {', '.join(CALIBRATE)}")
        if self.screen not in SEARCH_SCREENS:
            raise ValueError(f"--screen {self.screen!r}; accepted: {', '.join(SEARCH_SCREENS)}")
        if not self.search_minutes > 0:
            raise ValueError(f"--search-minutes {self.search_minutes}: expected a positive number of minutes")
        if self.fidelity_subsets < 2:
            raise ValueError(f"--fidelity-subsets {self.fidelity_subsets}: a rank correlation needs >= 2 subsets")


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
        """Store a stage's result with what made it (commit, dirty files, date, torch threads, machine)."""
        atomic.write_json(self.dir / f"{name}.json", {"key": key, "result": result, "made_by": made_by()})
        return result

    def made_by(self) -> dict[str, dict]:
        """Each stored stage's ``made_by`` (stages stored before it was kept: absent)."""
        out = {}
        for path in sorted(self.dir.glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if record.get("made_by"):
                out[path.stem] = record["made_by"]
        return out


def made_by() -> dict:
    """What a stage was made by: :func:`~icl_ssm.provenance.environment` and the tracked files that
    differed from its commit."""
    from icl_ssm.provenance import provenance

    prov = provenance("icl-ssm run")
    return {key: prov[key] for key in ("commit", "modified_files", "date", "machine", "device_name")}


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
    """Stage 1: which compressor (and control) to use: the one given, else the one shipped for the
    model and task, else one distilled with ``--distill``, else none (``{"compressor": None}``):
    the evaluators then use dense caches and the search runs without a screen."""
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
    if not cfg.distill:
        say(f"no compressor is shipped for {cfg.model} / {cfg.task}: selecting on dense caches (a compressor "
            "distilled in a run has not passed its fidelity verdict in any run measured, "
            "docs/research/prompt-search.md; --distill distils one first, --compressor DIR takes one)")
        return {"compressor": None, "control": None, "source": "none"}
    dcfg = DistillConfig(model=cfg.model, tasks=(cfg.task,), k=cfg.k, samples=cfg.distill_samples,
                         seed=cfg.seed, state_size=cfg.state_size, num_virtual=cfg.num_virtual,
                         num_sink=cfg.num_sink, latent_size=cfg.latent_size, num_recent=cfg.num_recent,
                         gate=cfg.gate, stage1_epochs=cfg.distill_epochs, stage2_epochs=cfg.distill_epochs,
                         task_options={cfg.task: cfg.task_options} if cfg.task_options else {})
    key = _key(asdict(dcfg))
    done = stages.get("compressor", key)
    if done is not None and (Path(done["compressor"]) / "model.safetensors").exists():
        return done
    target = out / "compressor"
    say(f"distilling a compressor into {target} ({cfg.distill_samples} subsets; --compressor DIR skips this)")
    train_compressor(dcfg, target, resume=(target / "checkpoint").exists())
    return stages.put("compressor", key, {"compressor": str(target), "control": cfg.control, "source": "distilled",
                                          "distill": asdict(dcfg)})


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
        say(f"the {comp['source']} compressor is not used and its fidelity not measured: no method asked scores "
            "subsets on compressed caches (affinity or bridge with --evaluator auto or compressed, or --screen auto "
            "or compressed)")
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
        key = _key([asdict(scfg), comp["compressor"]])
        result = stages.get(f"select-{name}", key)
        if result is None:
            with stage_bar(f"select {name}", "subsets") as (on_start, advance):
                selection, summary, pool = select_demonstrations(scfg, model, tokenizer, compressor, splits=splits,
                                                                 on_start=on_start, progress=advance,
                                                                 say=lambda line, n=name: say(f"select {n}: {line}"))
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


def run_splits(cfg: RunConfig, task=None) -> Splits:
    """The pool, validation and test splits of a run: validation large enough for the selection's
    queries and the check's examples (a small file gets splits sized to it; ``Splits.note`` says so)."""
    task = task or get_task(cfg.task, **cfg.task_options)
    return split(task, pool_size=cfg.pool_size, seed=cfg.seed, fit=True, k=cfg.k,
                 min_val_size=held_out_start(cfg) + cfg.check_size)


def fidelity_stage(cfg: RunConfig, comp: dict, stages: Stages) -> dict:
    """Stage 2: the compressor's fidelity on held-out subsets, beside its control when there is one."""
    fcfg = FidelityConfig(model=cfg.model, task=cfg.task, k=cfg.k, compressor=comp["compressor"],
                          control=comp.get("control"), subsets=cfg.fidelity_subsets, queries=cfg.fidelity_queries,
                          seed=cfg.seed, batch=cfg.batch, query_batch=cfg.query_batch,
                          task_options=cfg.task_options)
    key = _key([asdict(fcfg), comp])
    fidelity = stages.get("fidelity", key)
    if fidelity is not None:
        say("fidelity: done before, skipped")
        return fidelity
    with stage_bar("fidelity", "subsets") as (on_start, advance):
        fidelity = run_fidelity(fcfg, on_start=on_start, progress=advance)
    return stages.put("fidelity", key, fidelity)


def held_out_start(cfg: RunConfig) -> int:
    """Validation examples the selection methods read (the first ones); the check's come after."""
    search = max(cfg.confirm_queries, cfg.screen_queries) if "search" in cfg.methods else 0
    return max(cfg.queries, search)


def search_config(cfg: RunConfig, base: SelectConfig, verdict: dict, selections: dict[str, dict]) -> SelectConfig:
    """The prompt search's settings: its screen (``none`` by default, i.e. random search into the
    dense confirmation; ``auto``: the compressed caches where the fidelity verdict trusts them, else
    none) and the other methods' picks as seeds."""
    screen = cfg.screen
    if screen == "auto":
        screen = "compressed" if verdict["evaluator"] == "compressed" else "none"
        why = ("the fidelity verdict passed the compressed caches" if screen == "compressed" else
               "no compressor" if not base.compressor else "the fidelity verdict failed the compressed caches")
        say(f"search: screen {screen} ({why}; --screen chooses)")
    elif screen == "none":
        say("search: no screen, random prompts straight into the dense confirmation (at equal time no screen beat "
            "this in the pre-registered experiment; --screen auto screens on compressed caches that pass the "
            "fidelity verdict)")
    seeds = {name: list(s["indices"]) for name, s in selections.items() if s.get("indices")}
    calibrations = {"search": ("none", "batch"), "batch": ("batch",), "none": ()}[cfg.calibrate]
    return replace(base, method="search", screen=screen, search_minutes=cfg.search_minutes,
                   screen_queries=cfg.screen_queries, confirm_queries=cfg.confirm_queries, seeds=seeds,
                   test_orders=cfg.test_orders, search_calibrations=calibrations)


def equal_cost_stage(cfg: RunConfig, stages: Stages, base: SelectConfig, dense: dict, splits: Splits, model,
                     tokenizer, compressor, comp: dict) -> dict:
    """Affinity on compressed caches given the dense evaluator's wall time as its budget
    (:mod:`icl_ssm.select.budget`): what the cheaper evaluation buys in subsets, queries and
    reliability. Its queries may grow beyond ``cfg.queries`` into the validation examples after
    the check's (never into them)."""
    spare = splits.validation[: cfg.queries] + splits.validation[cfg.queries + cfg.check_size:]
    minutes = dense["wall_seconds"] / 60
    scfg = replace(base, method="affinity", evaluator="compressed", subsets=None, budget=minutes,
                   queries=len(spare), stratify=cfg.stratify)
    key = _key([asdict(scfg), comp["compressor"]])
    result = stages.get("select-affinity-equal-cost", key)
    if result is not None:
        say("select affinity at the dense evaluator's cost: done before, skipped")
        return result
    say(f"select affinity on compressed caches in the dense evaluator's time ({dense['wall_seconds']:.0f} s)")
    with stage_bar("select affinity (equal cost)", "subsets") as (on_start, advance):
        selection, summary, _ = select_demonstrations(
            scfg, model, tokenizer, compressor, splits=replace(splits, validation=spare), on_start=on_start,
            progress=advance, say=lambda line: say(f"select affinity (equal cost): {line}"))
    summary["scores"] = [None if s != s else float(s) for s in selection.scores.tolist()]
    return stages.put("select-affinity-equal-cost", key, summary)


def uses_compressor(cfg: RunConfig) -> bool:
    """Whether a method ``cfg`` asks for may score subsets on compressed caches, so that the
    fidelity stage's verdict is read: affinity or BRIDGE not forced onto dense caches, or a
    search screen of ``auto`` or ``compressed``."""
    evaluated = any(m in EVALUATED for m in cfg.methods) and cfg.evaluator != "dense"
    screened = "search" in cfg.methods and cfg.screen in ("auto", "compressed")
    return evaluated or screened


def choose_evaluator(cfg: RunConfig, fidelity: dict | None, unused: bool = False) -> dict:
    """The evaluator of affinity, BRIDGE and the search's screen:
    :func:`~icl_ssm.evaluate.verdict.fidelity_verdict` on the fidelity stage (``cfg.evaluator="auto"``),
    or the one ``cfg.evaluator`` forces. The verdict is printed whether it passes or fails; a
    forced evaluator says so, and compressed caches forced against a failed verdict are warned about.
    Without a compressor (``fidelity`` None) the evaluator is dense and the reason says so; ``unused``:
    there was one, but no method asked reads the verdict (:func:`uses_compressor`)."""
    if fidelity is None:
        if cfg.evaluator == "compressed" and not unused:
            raise ValueError(f"--evaluator compressed needs a compressor, and none is shipped for --model {cfg.model} "
                             f"and --task {cfg.task}: pass --compressor DIR or --distill")
        reason = ("no method asked scores subsets on compressed caches, so the compressor's fidelity was not measured"
                  if unused else
                  "no compressor was given, shipped or distilled, so affinity scores subsets on dense caches")
        return {"evaluator": "dense", "verdict": "dense", "reason": reason, "summary": reason, "checks": []}
    verdict = fidelity_verdict(fidelity, max_accuracy_drop=cfg.max_accuracy_drop)
    verdict["verdict"] = verdict["evaluator"]
    if verdict.get("summary") and verdict["verdict"] == "compressed":  # a failed verdict is said below, once
        say(verdict["summary"])
    if cfg.evaluator != "auto":
        verdict["evaluator"] = cfg.evaluator
        verdict["reason"] = f"--evaluator {cfg.evaluator} was asked for" + (
            f"; the fidelity verdict would have chosen {verdict['verdict']}"
            if verdict["verdict"] != cfg.evaluator else "")
    if verdict["verdict"] == "dense":
        if cfg.evaluator == "compressed":
            say(f"warning: the fidelity verdict failed the compressed caches ({failed_checks(verdict['checks'])}); "
                "selecting with them because --evaluator compressed was asked for")
        else:
            say(f"warning: {verdict['reason']}")
    return verdict


def _calibration(cfg: RunConfig, selection: dict, model, builder: PromptBuilder, demos, inputs):
    """A pick's calibration, estimated on ``inputs``: the search's winner keeps the calibration it
    won with (with ``--calibrate search``); every other pick is batch-calibrated."""
    method = selection.get("calibration") if selection.get("calibrations") else "batch"
    method = method or "none"
    return None if method == "none" else calibrate_prompt(model, builder, demos, method, inputs,
                                                          query_batch=cfg.query_batch)


def calibration_summary(handed: dict, randoms: list[dict], zero: dict, test_size: int) -> dict:
    """What calibration and selection each earned on the test split: the handed-over prompt raw and
    as handed over, the median random prompt raw and batch-calibrated, zero-shot raw and
    calibrated, and the gain over the median raw random prompt split into calibration (the median
    calibrated minus the median raw random prompt) and selection (the handed-over prompt minus the
    median calibrated random prompt)."""
    raw = float(np.median([r["test_accuracy"] for r in randoms]))
    cal = float(np.median([r["calibrated_test_accuracy"] for r in randoms]))
    return {"test_size": test_size, "random_prompts": len(randoms), "handed": handed["test_accuracy"],
            "handed_raw": handed["raw_test_accuracy"], "random_median_raw": raw, "random_median_calibrated": cal,
            "zero_shot_raw": zero["raw_accuracy"], "zero_shot_calibrated": zero["accuracy"],
            "gain_over_random_raw": handed["test_accuracy"] - raw, "from_calibration": cal - raw,
            "from_selection": handed["test_accuracy"] - cal}


def headroom_stage(cfg: RunConfig, stages: Stages, splits: Splits, model, tokenizer) -> dict | None:
    """Before the search: how far calibrated random prompts still differ, and whether validation can
    rank them (:mod:`icl_ssm.select.headroom`); the rule there decides whether the search runs.
    None where it is not measured (no calibration, no search, ``--no-headroom``, a generative task)."""
    task = get_task(cfg.task, **cfg.task_options)
    if cfg.calibrate == "none" or "search" not in cfg.methods or not cfg.headroom or task.kind != "classification":
        return None
    read = splits.validation[: held_out_start(cfg)]
    key = _key([cfg.model, cfg.task, cfg.task_options, cfg.k, cfg.seed, cfg.pool_size, [e.id for e in read],
                HEADROOM_PROMPTS, MIN_RELIABILITY])
    done = stages.get("headroom", key)
    if done is None:
        builder = PromptBuilder.for_model(model, tokenizer, task)
        with stage_bar("headroom after calibration", "prompts") as (on_start, advance):
            on_start(HEADROOM_PROMPTS)
            done = measure_headroom(model, builder, splits.pool, read, cfg.k, np.random.default_rng([cfg.seed, 5]),
                                    query_batch=cfg.query_batch)
            advance(HEADROOM_PROMPTS)
        search, why = can_add(done)
        done = stages.put("headroom", key, {**done, "search": search, "why": why})
    say(f"headroom: {done['why']}")
    return done


def quick_selection(cfg: RunConfig, room: dict, splits: Splits, model, tokenizer) -> dict:
    """The prompt handed over where the headroom says a search cannot add: the first of the headroom's
    label-balanced random prompts (not the best on validation, which cannot rank them), batch-calibrated."""
    task = get_task(cfg.task, **cfg.task_options)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    indices = list(room["prompts"][0])
    scored = evaluate_selection(model, builder, [splits.pool[i] for i in indices], splits.test[: cfg.test_size],
                                query_batch=cfg.query_batch)
    return {"method": "calibrated random prompt", "indices": indices, "test_accuracy": scored["accuracy"],
            "test_size": min(cfg.test_size, len(splits.test)), "flops": None, "wall_seconds": room["seconds"],
            "calibrations": ["batch"], "calibration": "batch", "labels": None}


def preferred_pick(selections: dict[str, dict]) -> str:
    """The stage whose pick the check judges: the search, else the quick calibrated prompt, else
    affinity, else the first run."""
    return next((m for m in ("search", QUICK, "affinity") if m in selections), next(iter(selections)))


def check_stage(cfg: RunConfig, stages: Stages, selections: dict[str, dict], splits: Splits, model,
                tokenizer) -> dict:
    """Every method's pick, zero-shot and ``cfg.random_prompts`` random prompts (drawn under the
    run's ``--per-label`` and ``--order`` rules) on held-out validation examples (those after the
    ones selection read), then which prompt to hand over and why
    (:func:`~icl_ssm.select.check.hand_over`); also the test accuracy of zero-shot and of every
    random prompt (the spread a user would meet without selection)."""
    preferred = preferred_pick(selections)
    # the search screened and confirmed the other picks already: only its own is checked beside random prompts
    names = [preferred] if preferred in ("search", QUICK) else list(selections)
    candidates = {name: selections[name]["indices"] for name in names}
    key = _key([candidates, asdict(cfg), "check-v3"])
    done = stages.get("check", key)
    if done is not None:
        say("check: done before, skipped")
        return done
    task = get_task(cfg.task, **cfg.task_options)
    builder = PromptBuilder.for_model(model, tokenizer, task)
    test = splits.test[: cfg.test_size]
    zero = evaluate_selection(model, builder, [], test, query_batch=cfg.query_batch)["accuracy"]
    start = held_out_start(cfg)
    held_out = splits.validation[start: start + cfg.check_size]
    if not held_out:
        say(f"warning: no validation examples are left after the {start} selection read, so the chosen "
            "prompt is not checked against random prompts; use a larger file or fewer --queries")
        return stages.put("check", key, {"skipped": True, "zero_shot_test_accuracy": zero, "test_size": len(test)})
    if len(held_out) < cfg.check_size:
        say(f"warning: only {len(held_out)} validation examples are left for the check (--check-size "
            f"{cfg.check_size}); it can tell only large differences apart")
    labels = [e.target for e in splits.pool] if cfg.per_label else None
    calibrate = cfg.calibrate != "none" and task.kind == "classification"
    read = splits.validation[:start]  # a calibration's inputs: those selection read (labels unread)
    calibrations = {name: _calibration(cfg, selections[name], model, builder, [splits.pool[i] for i in ix], read)
                    for name, ix in candidates.items()} if calibrate else {}
    result = check_prompts(model, builder, splits.pool, held_out, candidates, cfg.k,
                           np.random.default_rng([cfg.seed, 1]), random_count=cfg.random_prompts,
                           query_batch=cfg.query_batch, labels=labels, order=cfg.order, calibrations=calibrations,
                           calibrated_alternatives=calibrate)
    handed = hand_over(result, preferred, keep=cfg.keep_selection)
    for row in result["random"]:  # the spread a user meets without selection, on the test split
        demos = [splits.pool[i] for i in row["indices"]]
        if calibrate:  # raw, and batch-calibrated on the test inputs (what calibrating a random prompt gives)
            scored = evaluate_calibrated(model, builder, demos, test, query_batch=cfg.query_batch)
            row["test_accuracy"], row["calibrated_test_accuracy"] = scored["raw_accuracy"], scored["accuracy"]
        else:
            row["test_accuracy"] = evaluate_selection(model, builder, demos, test,
                                                      query_batch=cfg.query_batch)["accuracy"]
    name = handed["name"]
    if calibrate:
        chosen = calibrations.get(name)
        if name.startswith(CALIBRATED):  # a calibrated random prompt or zero-shot: its bias on the inputs read
            chosen = calibrate_prompt(model, builder, [splits.pool[i] for i in handed["indices"]], "batch", read)
        handed["calibration"] = None if chosen is None else chosen.to_dict()
        scored = evaluate_calibrated(model, builder, [splits.pool[i] for i in handed["indices"]], test,
                                     chosen or no_calibration(task.labels), query_batch=cfg.query_batch)
        handed["test_accuracy"], handed["raw_test_accuracy"] = scored["accuracy"], scored["raw_accuracy"]
        zero_cal = evaluate_calibrated(model, builder, [], test, query_batch=cfg.query_batch)
        result["calibrated"] = calibration_summary(handed, result["random"], zero_cal, len(test))
    elif name in selections:
        handed["test_accuracy"] = selections[name]["test_accuracy"]
    elif name == ZERO_SHOT:
        handed["test_accuracy"] = zero
    else:
        handed["test_accuracy"] = result["random"][int(name.split("-")[1])]["test_accuracy"]
    if handed["zero_shot_best"]:
        say("warning: the zero-shot prompt scored above every k-shot prompt checked; demonstrations may not help "
            "this model on this task")
    return stages.put("check", key, {**result, "preferred": preferred, "handed_over": handed,
                                     "zero_shot_test_accuracy": zero, "test_size": len(test),
                                     "held_out": [start, start + len(held_out)]})


_SEARCH_KEYS = ("screen", "plan", "budget_seconds", "wall_seconds", "phases", "screened", "sources",
                "screen_queries", "confirm_queries", "screen_split_half", "screen_reliability",
                "screen_vs_confirm_spearman", "rungs", "stopped", "slower_than_pilot", "winner_source",
                "winner_confirm_loss", "order_search")
_ROW_KEYS = ("method", "evaluator", "test_accuracy", "flops", "wall_seconds", "subsets", "indices", "labels",
             "test_size", "test_accuracy_orders", "test_accuracy_order_mean", "test_accuracy_std", "reliability",
             "queries_used", "validation_size", "score_reliability")


def write_outputs(cfg: RunConfig, out: Path, comp: dict, fidelity: dict | None, selections: dict[str, dict],
                  splits: Splits, model, tokenizer, check: dict | None = None, verdict: dict | None = None,
                  headroom: dict | None = None) -> dict:
    """selected.jsonl + prompt.txt (the prompt handed over: the method's pick when it passed the
    check against random prompts, else the best-checked prompt) and the report."""
    from icl_ssm.report.write import write_report

    pool = splits.pool
    preferred = (check or {}).get("preferred") or preferred_pick(selections)
    pick = selections[preferred]
    handed = (check or {}).get("handed_over") or {"name": preferred, "indices": pick["indices"]}
    scores = pick.get("scores") if handed["indices"] == pick["indices"] else None
    scores = scores or [None] * len(pool)
    atomic.write_jsonl(out / "selected.jsonl", selected_rows(pool, handed["indices"], scores))
    task = get_task(cfg.task, **cfg.task_options)
    made = pool_spec(pool, size=cfg.pool_size, seed=cfg.seed, k=cfg.k,
                     min_validation=held_out_start(cfg) + cfg.check_size)
    handed_over = SelectedPrompt.from_pool(pool, handed["indices"], model=cfg.model, task=task, method=handed["name"],
                                           task_options=cfg.task_options, pool_made=made, compressor=comp["compressor"],
                                           fidelity=compressor_fidelity(comp["compressor"], verdict),
                                           calibration=Calibration.from_dict(handed["calibration"])
                                           if handed.get("calibration") else None)
    handed_over.save(out)  # selection.json: what icl-ssm answer loads
    builder = PromptBuilder.for_model(model, tokenizer, task)
    atomic.write_text(out / "prompt.txt", builder.build_prefix([pool[i] for i in handed["indices"]]).text)
    dense = selections.get("affinity-dense")
    titles = {QUICK: "calibrated random prompt", "affinity-dense": "affinity (dense)",
              "affinity-equal-cost": "affinity (dense's time)",
              "search": "search (whole prompts)"}
    first = ["search", QUICK, "affinity", "affinity-dense", "affinity-equal-cost"]
    rows = []
    for name in first + [n for n in selections if n not in first]:
        if name not in selections:
            continue
        s = selections[name]
        row = {key: s.get(key) for key in _ROW_KEYS} | {"method": titles.get(name, s.get("method")), "name": name}
        if name == "affinity" and dense is not None:
            row.update(dense_flops=dense["flops"], dense_wall_seconds=dense["wall_seconds"],
                       dense_test_accuracy=dense["test_accuracy"])
        rows.append(row)
    if check and check.get("zero_shot_test_accuracy") is not None:  # what the prompt is measured against
        rows.append({"method": "zero-shot", "name": ZERO_SHOT, "evaluator": None,
                     "test_accuracy": check["zero_shot_test_accuracy"], "test_size": check.get("test_size"),
                     "flops": 0, "wall_seconds": None, "indices": []})
    search = selections.get("search")
    report = {
        "model": cfg.model, "task": cfg.task, "k": cfg.k, "seed": cfg.seed,
        "compressor": comp,
        "fidelity": None if fidelity is None else {k: v for k, v in fidelity.items() if k not in ("config", "argv")},
        "selections": rows,
        "affinity_scores": selections["affinity"]["scores"] if "affinity" in selections else None,
        "picks": {name: s["indices"] for name, s in selections.items()}, "preferred": preferred,
        "prompt_file": "prompt.txt", "selected_file": "selected.jsonl",
        "pool_size": len(pool), "run_config": asdict(cfg), "check": check, "handed_over": handed,
        "fidelity_verdict": verdict,
        "search": None if search is None else {key: search.get(key) for key in _SEARCH_KEYS},
        "headroom": headroom, "stages_made_by": Stages(out).made_by(),
    }
    write_report(out, report)
    return report
