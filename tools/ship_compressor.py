"""Copy a trained compressor (and its control) into the package as a shipped default.

    python tools/ship_compressor.py RUN_DIR [--control CONTROL_DIR] --name NAME --command "..." [--fidelity JSON]

Weights are stored in bfloat16 (half the size; loading upcasts to the config's float32),
beside recipe.json: the model, tasks and k, the distillation config and the exact command
that reproduces the run.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from icl_ssm import atomic
from icl_ssm.compress.pretrained import pretrained_root


def copy_half(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = load_file(str(src / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()},
              str(dst / "model.safetensors"), metadata={"format": "pt"})


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("run")
    p.add_argument("--control")
    p.add_argument("--control-command")
    p.add_argument("--name", required=True)
    p.add_argument("--command", required=True)
    p.add_argument("--fidelity", help="fidelity JSON of this run, summarised into the recipe")
    args = p.parse_args()
    run = Path(args.run)
    cfg = json.loads((run / "distill_config.json").read_text())
    target = pretrained_root() / args.name
    if target.exists():
        shutil.rmtree(target)
    copy_half(run, target / "compressor")
    recipe = {"model": cfg["model"], "tasks": cfg["tasks"], "k": cfg["k"], "seed": cfg["seed"],
              "command": args.command, "distill_config": cfg, "weights": "bfloat16 copy of the float32 run"}
    if args.control:
        copy_half(Path(args.control), target / "control")
        recipe["control_command"] = args.control_command
    if args.fidelity:
        report = json.loads(Path(args.fidelity).read_text())
        recipe["fidelity"] = {k: v for k, v in report.items() if k not in ("config", "argv")}
    atomic.write_json(target / "recipe.json", recipe)
    print(target, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
