"""Which compressor a run uses, whether any method reads it, its fidelity stage and the
evaluator the fidelity verdict chooses."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from icl_ssm.compress.compressor import load_compressor
from icl_ssm.compress.pretrained import find_pretrained
from icl_ssm.distill.config import DistillConfig
from icl_ssm.distill.run import train_compressor
from icl_ssm.evaluate.fidelity import FidelityConfig, run_fidelity
from icl_ssm.lm.models import resolve_device
from icl_ssm.pipeline.config import RunConfig
from icl_ssm.pipeline.context import Run
from icl_ssm.pipeline.stages import say, stage_bar, stage_key
from icl_ssm.select.config import EVALUATED

SOURCES = ("given", "shipped", "distilled", "none", "unused")  # where a run's compressor came from


@dataclass(frozen=True)
class CompressorChoice:
    """The compressor stage's result: the compressor directory (None: dense caches), its control,
    where it came from (:data:`SOURCES`; ``unused``: there was one, but no method asked reads it),
    and the shipped one's recipe or the distilled one's settings."""

    compressor: str | None
    control: str | None
    source: str
    recipe: dict | None = None
    distill: dict | None = None

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> CompressorChoice:
        return cls(**{key: record.get(key) for key in ("compressor", "control", "source", "recipe", "distill")})

    def as_dict(self) -> dict[str, Any]:
        """The report's ``compressor``: recipe and distill settings only where there are any."""
        return {key: value for key, value in asdict(self).items()
                if value is not None or key in ("compressor", "control")}

    def load(self, config: Any = None) -> Any:
        """The compressor, on ``config``'s model (None without one)."""
        return None if self.compressor is None else load_compressor(self.compressor, config)


def choose_compressor(run: Run) -> CompressorChoice:
    """Stage 1 (:func:`resolve_compressor`), and ``unused`` where there is a compressor but no
    method ``run.cfg`` asks for reads it (:func:`uses_compressor`): its fidelity is then not measured."""
    comp = resolve_compressor(run)
    if comp.compressor is not None and not uses_compressor(run.cfg):
        say(f"the {comp.source} compressor is not used and its fidelity not measured: no method asked reads "
            "it (affinity, bridge, or --screen auto or compressed)")
        return CompressorChoice(None, None, "unused")
    return comp


def resolve_compressor(run: Run) -> CompressorChoice:
    """Which compressor (and control) to use: the one given, else the one shipped for the model
    and task, else one distilled with ``--distill``, else none: the evaluators then use dense
    caches and the search runs without a screen."""
    cfg = run.cfg
    if cfg.compressor:
        load_compressor(cfg.compressor)  # a clear error now rather than after the other stages
        return CompressorChoice(str(Path(cfg.compressor).resolve()), cfg.control, "given")
    shipped = None if cfg.distill else find_pretrained(cfg.model, cfg.task, cfg.k)
    if shipped is not None:
        control = shipped / "control"
        recipe = json.loads((shipped / "recipe.json").read_text())
        say(f"using the compressor shipped for {cfg.model} / {cfg.task} ({shipped.name}, trained at k={recipe['k']})")
        control = cfg.control or (str(control) if control.is_dir() else None)
        return CompressorChoice(str(shipped / "compressor"), control, "shipped", recipe=recipe)
    if not cfg.distill:
        say(f"no compressor is shipped for {cfg.model} / {cfg.task}: selecting on dense caches (a compressor "
            "distilled in a run has not passed its fidelity verdict in any run measured, "
            "docs/research/prompt-search.md; --distill distils one first, --compressor DIR takes one)")
        return CompressorChoice(None, None, "none")
    return _distilled(run)


def _distilled(run: Run) -> CompressorChoice:
    """A short distillation into ``OUT/compressor`` with the run's compressor shape (resumed if
    interrupted; kept as the ``compressor`` stage)."""
    cfg = run.cfg
    dcfg = DistillConfig(model=cfg.model, tasks=(cfg.task,), k=cfg.k, samples=cfg.distill_samples,
                         seed=cfg.seed, state_size=cfg.state_size, num_virtual=cfg.num_virtual,
                         num_sink=cfg.num_sink, latent_size=cfg.latent_size, num_recent=cfg.num_recent,
                         gate=cfg.gate, stage1_epochs=cfg.distill_epochs, stage2_epochs=cfg.distill_epochs,
                         task_options={cfg.task: cfg.task_options} if cfg.task_options else {})
    key = stage_key(asdict(dcfg))
    done = run.stages.get("compressor", key)
    if done is not None and (Path(done["compressor"]) / "model.safetensors").exists():
        return CompressorChoice.from_dict(done)
    target = run.out / "compressor"
    say(f"distilling a compressor into {target} ({cfg.distill_samples} subsets; --compressor DIR skips this)")
    train_compressor(dcfg, target, resume=(target / "checkpoint").exists())
    choice = CompressorChoice(str(target), cfg.control, "distilled", distill=asdict(dcfg))
    run.stages.put("compressor", key, choice.as_dict())
    return choice


def fidelity_stage(run: Run, comp: CompressorChoice) -> dict | None:
    """Stage 2: the compressor's fidelity on held-out subsets, beside its control when there is
    one; None without a compressor."""
    if comp.compressor is None:
        return None
    cfg = run.cfg
    fcfg = FidelityConfig(model=cfg.model, task=cfg.task, k=cfg.k, compressor=comp.compressor,
                          control=comp.control, subsets=cfg.fidelity_subsets, queries=cfg.fidelity_queries,
                          seed=cfg.seed, batch=cfg.batch, query_batch=cfg.query_batch,
                          task_options=cfg.task_options)
    key = stage_key([asdict(fcfg), comp.as_dict()])
    fidelity = run.stages.get("fidelity", key)
    if fidelity is not None:
        say("fidelity: done before, skipped")
        return fidelity
    # the run's model and builder where the fidelity measurement runs on the same device (else it loads its own)
    same = run.model is not None and resolve_device(fcfg.device) == run.model.device
    held = {"model": run.model, "builder": run.builder} if same else {}
    with stage_bar("fidelity", "subsets") as (on_start, advance):
        fidelity = run_fidelity(fcfg, on_start=on_start, progress=advance, **held)
    return run.stages.put("fidelity", key, fidelity)


def uses_compressor(cfg: RunConfig) -> bool:
    """Whether a method ``cfg`` asks for reads the fidelity stage's verdict: affinity or BRIDGE
    (their evaluator, or what it would have been when ``--evaluator`` forces one), or a search
    screen of ``auto`` or ``compressed``."""
    evaluated = any(m in EVALUATED for m in cfg.methods)  # forced onto dense, the verdict is still reported
    screened = "search" in cfg.methods and cfg.screen in ("auto", "compressed")
    return evaluated or screened
