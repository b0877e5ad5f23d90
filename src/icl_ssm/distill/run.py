"""Distillation end to end: build (or reuse) the teacher cache, then train a compressor.

:func:`train_compressor` is the entry point (``icl-ssm distill`` parses its flags into a
:class:`~icl_ssm.distill.config.DistillConfig` and calls it). It works as-is in one process and
under ``accelerate launch`` (data parallel: teacher shards and training groups are split across
processes, and every process ends with the same weights)."""

from __future__ import annotations

import json
import os
import sys
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

import torch

from icl_ssm import atomic
from icl_ssm.distill.config import DistillConfig
from icl_ssm.distill.spec import TeacherSpec, model_fingerprint
from icl_ssm.distill.teacher import TeacherCache, answer_leads, build_teacher_cache, task_builders
from icl_ssm.distill.train import train
from icl_ssm.lm.models import load_model
from icl_ssm.lock import LOCK, one_writer


def teacher_spec(cfg: DistillConfig, model, tokenizer) -> TeacherSpec:
    leads = answer_leads(*task_builders(model, tokenizer, cfg.tasks, seed=cfg.seed, chat=cfg.chat,
                                         task_options=cfg.task_options))
    return TeacherSpec(model=cfg.model, model_fingerprint=model_fingerprint(model), tasks=cfg.tasks, k=cfg.k,
                       episodes=cfg.samples, queries=cfg.queries, group_size=cfg.group_size,
                       num_virtual=cfg.num_virtual, num_sink=cfg.num_sink, num_recent=cfg.num_recent,
                       topk=cfg.topk, seed=cfg.seed, chat=cfg.chat, shared_tail=cfg.shared_tail,
                       shared_tail_every=cfg.shared_tail_every, answer_leads=leads)


def validate_out(out: Path, cfg: DistillConfig, resume: bool) -> str:
    """``"new"``, ``"resume"`` (an unfinished run with these settings, whether or not ``resume``
    was asked) or ``"done"``; refuses an ``--out`` that holds another run, and ``resume`` where
    there is nothing to continue."""
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
    elif out.exists() and any(p.name != LOCK and not atomic.is_temporary(p)
                              for p in out.iterdir()):  # the lock and half-written files of a killed start
        raise ValueError(f"--out {str(out)!r} is not empty and holds no icl-ssm distillation run")
    kept, moved = out / "checkpoint", out / "checkpoint.old"
    if not kept.exists() and moved.is_dir():  # killed between the two renames of a checkpoint's replacement
        os.replace(moved, kept)
    if kept.exists():  # the same settings (checked above): an unfinished run continues, --resume or not
        return "resume"
    if resume:
        raise ValueError(f"--resume: no checkpoint in {str(out)!r}")
    return "new"


def _plain(main: bool) -> bool:
    """A log (stderr not a terminal) gets plain lines: teacher shards, every 10 training steps."""
    return main and not sys.stderr.isatty()


def _progress(main: bool):
    """A rich progress display (disabled off the main process)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("{task.fields[info]}"), TimeRemainingColumn())
    return Progress(*columns, disable=not main, transient=False)


def _teacher_targets(model, tokenizer, spec: TeacherSpec, directory: str | Path | None, accelerator, bar) -> Path:
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


def train_compressor(cfg: DistillConfig, out: str | Path, *, resume: bool = False,
                     teacher_cache: str | Path | None = None, stop_after: int | None = None) -> Path:
    """Train the compressor ``cfg`` describes into ``out`` and return ``out``.

    ``out`` holds ``distill_config.json``, checkpoints while training and, at the end,
    ``config.json`` + ``model.safetensors`` (load with
    :func:`~icl_ssm.compress.compressor.load_compressor`). A finished run with the same config
    is returned as it is; an unfinished one with the same settings continues from its checkpoint;
    an ``out`` holding another run is refused. ``teacher_cache``: the teacher-target directory (default: keyed by the
    settings under ``$ICL_SSM_CACHE/teacher``). Raises
    :class:`~icl_ssm.distill.train.TrainingDiverged` when a loss stops being finite.
    ``stop_after`` stops after that many steps (tests: an interrupted run)."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    out = Path(out)
    state = validate_out(out, cfg, resume)
    if state == "done":
        print(f"{out}: a compressor with this exact configuration is already trained there", file=sys.stderr)
        return out
    if state == "resume" and not resume:
        print(f"{out}: continuing the unfinished run there from its last checkpoint (same settings)", file=sys.stderr)
    model, tokenizer = load_model(cfg.model, device=accelerator.device)
    spec = teacher_spec(cfg, model, tokenizer)
    main = accelerator.is_main_process
    with ExitStack() as stack:
        if main:  # one writer per --out (under accelerate, the main process writes)
            out.mkdir(parents=True, exist_ok=True)
            stack.enter_context(one_writer(out, "icl-ssm distill"))
            atomic.write_text(out / "distill_config.json", json.dumps(asdict(cfg), indent=1))
        plain = _plain(main)
        with _progress(main) as bar:
            directory = _teacher_targets(model, tokenizer, spec, teacher_cache, accelerator, bar)
            teacher = TeacherCache.open(directory, spec)
            job = bar.add_task("distilling", total=None, info="")

            def show(record: dict) -> None:
                keys = ("kv", "kl", "hidden", "rank", "label", "gate_mean")
                info = f"stage {record['stage']} loss {record['loss']:.4f} " + " ".join(
                    f"{k} {record[k]:.4f}" for k in keys if k in record)
                if "dt" in record:
                    info += " dt " + ",".join(f"{v:.2g}" for v in record["dt"])
                done = record["step"] + 1 - record.get("start_step", 0)  # steps run by this process (after resume)
                info += f" | {done / max(record['seconds'], 1e-9):.2f} steps/s"
                bar.update(job, completed=record["step"] + 1, total=record["total_steps"], info=info)
                if plain and ((record["step"] + 1) % 10 == 0 or record["step"] + 1 == record["total_steps"]):
                    print(f"step {record['step'] + 1}/{record['total_steps']} {info}", file=sys.stderr, flush=True)

            train(model, teacher, cfg, out, resume=state == "resume", accelerator=accelerator, progress=show,
                  stop_after=stop_after)
    if main:
        print(f"compressor written to {out}", file=sys.stderr)
    return out


def fill_teacher_cache(cfg: DistillConfig, directory: str | Path | None = None) -> Path:
    """Fill the teacher cache for ``cfg`` and return its directory, training nothing: several
    runs that share it (a compressor and its control, say) can then train side by side
    without computing it twice."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model, tokenizer = load_model(cfg.model, device=accelerator.device)
    with _progress(accelerator.is_main_process) as bar:
        path = _teacher_targets(model, tokenizer, teacher_spec(cfg, model, tokenizer), directory, accelerator, bar)
    if accelerator.is_main_process:
        print(f"teacher cache complete: {path}", file=sys.stderr)
    return path
