"""What a distillation run keeps on disk: the checkpoint it resumes from (weights, optimiser
state, step, history and the torch RNG state) and its final weights, config and history; every
directory and file written atomically."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from icl_ssm import atomic


def _atomic_dir_write(target: Path, write: Callable[[Path], None]) -> None:
    tmp = target.with_name(target.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    write(tmp)
    old = target.with_name(target.name + ".old")
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    if old.exists():
        shutil.rmtree(old)


def save_checkpoint(directory: Path, compressor, optimizer, step: int, history: list[dict]) -> None:
    def write(tmp: Path) -> None:
        compressor.save_pretrained(tmp)
        torch.save({"optimizer": optimizer.state_dict(), "step": step, "history": history,
                    "torch_rng": torch.get_rng_state()}, tmp / "trainer_state.pt")

    _atomic_dir_write(directory / "checkpoint", write)


def save_final(out: Path, compressor, cfg, history: list[dict]) -> None:
    """The trained weights, config and history, each file complete or absent.

    ``save_pretrained`` writes into a temporary directory beside them; its files get the mode a
    plain ``open()`` would give (safetensors writes owner-only files) and are renamed into
    ``out`` one by one, the weights last: weights present and no checkpoint left is what
    ``validate_out`` reads as a finished run.
    """
    tmp = out / ".final.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    compressor.save_pretrained(tmp)
    for f in sorted(tmp.iterdir(), key=lambda f: f.name == "model.safetensors"):
        atomic.move_in(f, out / f.name)
    tmp.rmdir()
    atomic.write_text(out / "distill_config.json", json.dumps(asdict(cfg), indent=1))
    atomic.write_text(out / "history.jsonl", "".join(json.dumps(h) + "\n" for h in history))


def load_checkpoint(directory: Path, compressor, optimizer) -> tuple[int, list[dict]]:
    ckpt = directory / "checkpoint"
    try:
        from safetensors.torch import load_file

        compressor.load_state_dict(load_file(str(ckpt / "model.safetensors")))
        # tensors and plain values only: a checkpoint directory someone sent must not run code when resumed
        trainer = torch.load(ckpt / "trainer_state.pt", weights_only=True)
        optimizer.load_state_dict(trainer["optimizer"])
        torch.set_rng_state(trainer["torch_rng"])
    except FileNotFoundError as err:
        raise ValueError(f"--resume: no checkpoint in {str(directory)!r} ({err.filename} is missing)") from err
    except pickle.UnpicklingError as err:
        raise ValueError(f"--resume: {str(ckpt / 'trainer_state.pt')!r} holds objects other than tensors and plain "
                         "values; it is not loaded (a pickled object can run code): delete the checkpoint directory "
                         "to train from the start") from err
    except Exception as err:
        raise ValueError(f"--resume: checkpoint in {str(ckpt)!r} is corrupted: {type(err).__name__}: {err}") from err
    return trainer["step"], trainer["history"]
