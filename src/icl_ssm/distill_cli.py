"""``icl-ssm distill``: build (or reuse) the teacher cache, then train a compressor.

Every :class:`~icl_ssm.distill.DistillConfig` field is a flag; a flag not given takes its value
from ``--recipe`` (``measured``, the default: the best recipe measured; ``paper``: the paper's
settings). Works as-is in one process and
under ``accelerate launch -m icl_ssm distill ...`` (data parallel: teacher shards and training
groups are split across processes)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, fields
from pathlib import Path

import torch

from icl_ssm import atomic
from icl_ssm.distill import FIELD_HELP, RECIPES, DistillConfig, TrainingDiverged, train
from icl_ssm.models import load_model
from icl_ssm.teacher import (
    TeacherCache,
    TeacherSpec,
    answer_leads,
    build_teacher_cache,
    model_fingerprint,
    task_builders,
)


def teacher_spec(cfg: DistillConfig, model, tokenizer) -> TeacherSpec:
    leads = answer_leads(*task_builders(model, tokenizer, cfg.tasks, seed=cfg.seed, chat=cfg.chat))
    return TeacherSpec(model=cfg.model, model_fingerprint=model_fingerprint(model), tasks=cfg.tasks, k=cfg.k,
                       episodes=cfg.samples, queries=cfg.queries, group_size=cfg.group_size,
                       num_virtual=cfg.num_virtual, num_sink=cfg.num_sink, num_recent=cfg.num_recent,
                       topk=cfg.topk, seed=cfg.seed, chat=cfg.chat, shared_tail=cfg.shared_tail,
                       shared_tail_every=cfg.shared_tail_every, answer_leads=leads)


def check_out(out: Path, cfg: DistillConfig, resume: bool) -> str:
    """``"new"``, ``"resume"`` or ``"done"``; refuses an ``--out`` that holds another run."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file, not a directory")
    stored_path = out / "distill_config.json"
    if stored_path.exists():
        stored = json.loads(stored_path.read_text())
        mine = json.loads(json.dumps(asdict(cfg)))
        # a field added later: the value that reproduces the runs from before it (the paper recipe's)
        default = json.loads(json.dumps(asdict(DistillConfig.recipe("paper"))))
        diffs = [f"{k}: {stored.get(k, default[k])!r} there, {v!r} requested"
                 for k, v in mine.items() if stored.get(k, default[k]) != v]
        if diffs:
            raise ValueError(f"--out {str(out)!r} holds another run (" + "; ".join(diffs) + "); choose another --out")
        if (out / "model.safetensors").exists() and not (out / "checkpoint").exists():
            return "done"
    elif out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {str(out)!r} is not empty and holds no icl-ssm distillation run")
    if (out / "checkpoint").exists():
        if not resume:
            raise ValueError(f"--out {str(out)!r} holds an unfinished run: pass --resume to continue it")
        return "resume"
    if resume:
        raise ValueError(f"--resume: no checkpoint in {str(out)!r}")
    return "new"


def distill_args(cfg: DistillConfig, out: str | Path, *, resume: bool = False,
                 teacher_cache: str | None = None) -> argparse.Namespace:
    """The namespace ``icl-ssm distill`` would parse for ``cfg``: drive it from Python."""
    return argparse.Namespace(**asdict(cfg), out=str(out), resume=resume, teacher_cache=teacher_cache,
                              stop_after=None, teacher_only=False, recipe="measured")


def _plain(main: bool) -> bool:
    """A log (stderr not a terminal) gets plain lines: teacher shards, every 10 training steps."""
    return main and not sys.stderr.isatty()


def _progress(main: bool):
    """A rich progress display (disabled off the main process)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("{task.fields[info]}"), TimeRemainingColumn())
    return Progress(*columns, disable=not main, transient=False)


def _teacher_targets(model, tokenizer, spec: TeacherSpec, directory: str | None, accelerator, bar) -> Path:
    """Build (or reuse) the teacher cache for ``spec`` with a progress bar; a log (stderr not a
    terminal) gets a plain line per shard."""
    job = bar.add_task("teacher targets", total=None, info="")
    plain = _plain(accelerator.is_main_process)

    def cached(done: int, total: int) -> None:
        bar.update(job, completed=done, total=total)
        if plain and (done % spec.shard_size == 0 or done == total):
            print(f"teacher targets {done}/{total} episodes, {bar.tasks[job].elapsed or 0:.0f} s",
                  file=sys.stderr, flush=True)

    directory = build_teacher_cache(model, tokenizer, spec, directory, rank=accelerator.process_index,
                                    world=accelerator.num_processes, progress=cached)
    accelerator.wait_for_everyone()
    return Path(directory)


def config_from_args(args: argparse.Namespace) -> DistillConfig:
    """The run ``icl-ssm distill`` was asked for: ``--recipe``'s values under the flags given."""
    given = {f.name: getattr(args, f.name) for f in fields(DistillConfig) if hasattr(args, f.name)}
    return DistillConfig.recipe(getattr(args, "recipe", "measured"), **given)


def run_distill(args: argparse.Namespace) -> int:
    from accelerate import Accelerator

    cfg = config_from_args(args)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    if getattr(args, "teacher_only", False):
        return _teacher_only(cfg, args.teacher_cache, accelerator)
    if not args.out:
        raise ValueError("--out is required: the directory for the compressor (or pass --teacher-only)")
    out = Path(args.out)
    state = check_out(out, cfg, args.resume)
    if state == "done":
        print(f"{out}: a compressor with this exact configuration is already trained there", file=sys.stderr)
        return 0
    model, tokenizer = load_model(cfg.model, device=accelerator.device)
    spec = teacher_spec(cfg, model, tokenizer)
    main = accelerator.is_main_process
    if main:
        out.mkdir(parents=True, exist_ok=True)
        atomic.write_text(out / "distill_config.json", json.dumps(asdict(cfg), indent=1))
    plain = _plain(main)
    with _progress(main) as bar:
        directory = _teacher_targets(model, tokenizer, spec, args.teacher_cache, accelerator, bar)
        teacher = TeacherCache.open(directory, spec)
        job = bar.add_task("distilling", total=None, info="")

        def show(record: dict) -> None:
            keys = ("kv", "kl", "hidden", "rank", "label", "gate_mean")
            info = f"stage {record['stage']} loss {record['loss']:.4f} " + " ".join(
                f"{k} {record[k]:.4f}" for k in keys if k in record)
            if "dt" in record:
                info += " dt " + ",".join(f"{v:.2g}" for v in record["dt"])
            done = record["step"] + 1 - record.get("start_step", 0)  # steps run by this process (after --resume)
            info += f" | {done / max(record['seconds'], 1e-9):.2f} steps/s"
            bar.update(job, completed=record["step"] + 1, total=record["total_steps"], info=info)
            if plain and ((record["step"] + 1) % 10 == 0 or record["step"] + 1 == record["total_steps"]):
                print(f"step {record['step'] + 1}/{record['total_steps']} {info}", file=sys.stderr, flush=True)

        try:
            train(model, teacher, cfg, out, resume=state == "resume", accelerator=accelerator, progress=show,
                  stop_after=args.stop_after)
        except TrainingDiverged as err:
            print(f"icl-ssm distill: {err}", file=sys.stderr)
            return 1
    if main:
        print(f"compressor written to {out}", file=sys.stderr)
    return 0


def _teacher_only(cfg: DistillConfig, directory: str | None, accelerator) -> int:
    """Fill the teacher cache for ``cfg`` and stop: several runs that share it (a compressor
    and its control, say) can then train side by side without computing it twice."""
    model, tokenizer = load_model(cfg.model, device=accelerator.device)
    with _progress(accelerator.is_main_process) as bar:
        path = _teacher_targets(model, tokenizer, teacher_spec(cfg, model, tokenizer), directory, accelerator, bar)
    if accelerator.is_main_process:
        print(f"teacher cache complete: {path}", file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distill", help="distil an SSM compressor from the teacher (Algorithm 1)")
    p.add_argument("--recipe", choices=list(RECIPES), default="measured",
                   help="the values of the flags not given: measured (the best recipe measured, BENCHMARKS.md) "
                        "or paper (the paper's settings) (default: measured)")
    measured, paper = DistillConfig(), DistillConfig.recipe("paper")
    for f in fields(DistillConfig):
        flag = "--" + ("task" if f.name == "tasks" else f.name.replace("_", "-"))
        default = getattr(measured, f.name)
        shown = " ".join(default) if f.name == "tasks" else default
        help_ = f"{FIELD_HELP[f.name]} (default: {shown}" + (
            f"; paper: {getattr(paper, f.name)})" if getattr(paper, f.name) != default else ")")
        kwargs = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_}  # not given: from --recipe
        if f.name == "tasks":
            p.add_argument(flag, nargs="+", **kwargs)
        elif isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
        else:
            p.add_argument(flag, type=type(default), **kwargs)
    p.add_argument("--out", help="directory for the compressor, its config and checkpoints (required unless "
                   "--teacher-only)")
    p.add_argument("--resume", action="store_true", help="continue the unfinished run in --out")
    p.add_argument("--teacher-cache", default=None,
                   help="teacher cache directory (default: keyed by settings under $ICL_SSM_CACHE/teacher)")
    p.add_argument("--teacher-only", action="store_true",
                   help="compute (or finish) the teacher cache for these settings and stop, training nothing")
    p.add_argument("--stop-after", type=int, default=None, help=argparse.SUPPRESS)  # tests: simulate an interruption
    p.set_defaults(func=run_distill)
