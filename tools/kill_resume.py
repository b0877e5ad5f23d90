"""SIGKILL at random points of ``run``, ``select``, ``answer`` and ``distill``, then the same command
again: does it complete, and are its outputs those of an uninterrupted run?

Each command runs on the tiny random model and a generated coin-flip file, one torch thread (so
that floats repeat to the bit). It is run twice uninterrupted first: what differs between those two
runs (timings, dates) is what no run can be asked to repeat, and is left out of the comparison.
Then, ``--kills`` times per command: the command in a subprocess, SIGKILL after a delay drawn
uniformly between ``--earliest`` and 1.0 of the uninterrupted run's wall time (a draw the command
outlives is drawn again on a fresh folder), and the same command again to completion. Its outputs
are compared with the first uninterrupted run's:

- every file of the uninterrupted run is there, and no other (no ``*.tmp``, no ``*.partial``);
- a file the two uninterrupted runs wrote byte for byte alike is byte for byte alike again;
- a JSON or JSON Lines file agrees at every key where the two uninterrupted runs agree (but
  ``answered_before`` / ``answered_now``, which say what a rerun continued from);
- a view of those files (``report.md``, a figure; both show timings) exists and is complete (a
  PNG ends with its IEND chunk);
- every other file exists and is not empty.

    python tools/kill_resume.py docs/results/kill-resume.json --kills 5 --seed 0

The record holds each kill: the command, the delay, what the output folder held at the kill, the
rerun's exit code and seconds, and each difference found (none when the rerun matches).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHAPE = ["--state-size", "16", "--num-virtual", "4", "--num-sink", "2", "--latent-size", "8"]


def commands(data: Path, inputs: Path, selection: Path) -> dict[str, list[str]]:
    """Each command's arguments, ``--out`` left to the caller."""
    return {
        "select": ["select", "--model", "tiny-llama", "--task", str(data), "--k", "3", "--pool-size", "24",
                   "--queries", "8", "--test-size", "12", "--method", "affinity", "--evaluator", "dense",
                   "--subsets", "96"],
        "answer": ["answer", str(selection), str(inputs), "--batch", "8"],
        "distill": ["distill", "--model", "tiny-llama", "--task", "coin_flip", "--k", "4", "--samples", "8",
                    "--queries", "2", "--group-size", "2", *SHAPE, "--stage1-epochs", "300",
                    "--checkpoint-every", "3"],
        "run": ["run", "--model", "tiny-llama", "--task", str(data), "--k", "3", *SHAPE, "--distill",
                "--distill-samples", "8", "--pool-size", "24", "--queries", "3", "--test-size", "12",
                "--fidelity-subsets", "4", "--fidelity-queries", "2", "--subsets", "8", "--batch", "4",
                "--methods", "affinity", "random", "bm25", "topk", "--calibrate", "batch"],
    }


def environment(cache: Path) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "ICL_SSM_CACHE": str(cache),
            "PYTHONPATH": str(ROOT / "src")}


def invoke(argv: list[str], out: Path, env: dict[str, str], timeout: float = 900) -> tuple[int, float, str]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "icl_ssm", *argv, "--out", str(out)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    return done.returncode, time.perf_counter() - t0, done.stderr[-2000:]


def killed(argv: list[str], out: Path, env: dict[str, str], delay: float) -> dict[str, Any]:
    """The command in a subprocess, SIGKILL after ``delay`` seconds (or its own end)."""
    proc = subprocess.Popen([sys.executable, "-m", "icl_ssm", *argv, "--out", str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=delay)
        return {"killed": False, "exit": proc.returncode, "held": files(out)}
    except subprocess.TimeoutExpired:
        held = files(out)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return {"killed": True, "exit": proc.returncode, "held": held}


def files(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) if out.is_dir() else []


def flat(node: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a JSON document by its path."""
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in flat(value, f"{prefix}.{key}").items()} or {prefix: {}}
    if isinstance(node, list):
        return {k: v for i, value in enumerate(node) for k, v in flat(value, f"{prefix}[{i}]").items()} or {prefix: []}
    return {prefix: node}


def parsed(path: Path) -> Any:
    text = path.read_text()
    if path.suffix == ".jsonl" or path.name.endswith(".jsonl.partial"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


IGNORED = (".icl-ssm.lock",)  # the writer's lock file: its pid and start time are the run's own
VIEWS = {".png": b"IEND\xaeB`\x82", ".md": b""}  # views of the JSON beside them, timings included: complete
RESUMED = ("answered_before", "answered_now")  # what a rerun says it continued from: differs by design


def compare(reference: Path, twin: Path, rerun: Path) -> list[str]:
    """The differences of ``rerun`` from ``reference`` that ``twin`` (a second uninterrupted run)
    does not share."""
    problems = []
    ref, other = set(files(reference)), set(files(rerun))
    ref -= set(IGNORED)
    other -= set(IGNORED)
    problems += [f"missing {name}" for name in sorted(ref - other)]
    problems += [f"extra {name}" for name in sorted(other - ref)]
    for name in sorted(ref & other):
        a, b, c = reference / name, twin / name, rerun / name
        if a.suffix in VIEWS:
            if not c.read_bytes().rstrip().endswith(VIEWS[a.suffix]) or c.stat().st_size == 0:
                problems.append(f"{name}: not complete")
            continue
        if b.is_file() and a.read_bytes() == b.read_bytes():
            if a.read_bytes() != c.read_bytes():
                problems.append(f"{name}: bytes differ")
            continue
        if a.suffix in (".json", ".jsonl"):
            try:
                fa, fc = flat(parsed(a)), flat(parsed(c))
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                problems.append(f"{name}: corrupt ({err})")
                continue
            fb = flat(parsed(b)) if b.is_file() else {}
            stable = {k for k in fa if fb.get(k, object()) == fa[k] and k.rsplit(".", 1)[-1] not in RESUMED}
            wrong = sorted(k for k in stable if fc.get(k, object()) != fa[k])
            if wrong:
                problems.append(f"{name}: differs at {', '.join(wrong[:5])}" + (" ..." if len(wrong) > 5 else ""))
        elif c.stat().st_size == 0:
            problems.append(f"{name}: empty")
    return problems


def prepare(root: Path, env: dict[str, str]) -> tuple[Path, Path, Path]:
    """The task file, 1,000 inputs to answer and a selection to answer them with."""
    code = ("import json,sys; from icl_ssm.data.tasks import get_task\n"
            "def write(p, ex): open(p, 'w').write(''.join(json.dumps({'text': e.input, 'label': e.target}) + '\\n' "
            "for e in ex))\n"
            "write(sys.argv[1], get_task('coin_flip', size=120).examples())\n"
            "write(sys.argv[2], get_task('coin_flip', size=1000, seed=7).examples())\n")
    data, inputs = root / "coin.jsonl", root / "inputs.jsonl"
    subprocess.run([sys.executable, "-c", code, str(data), str(inputs)], env=env, check=True)
    selection = root / "selection"
    rc, _, err = invoke(["select", "--model", "tiny-llama", "--task", str(data), "--k", "3", "--pool-size", "24",
                         "--queries", "3", "--test-size", "6", "--method", "random"], selection, env)
    if rc:
        raise SystemExit(f"could not make the selection to answer with: {err}")
    return data, inputs, selection


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("record", help="the JSON record to write")
    parser.add_argument("--kills", type=int, default=5, help="kills per command")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--earliest", type=float, default=0.25,
                        help="the earliest kill, as a share of the uninterrupted run's wall time (before it the "
                             "process is still importing)")
    parser.add_argument("--commands", nargs="+", default=["select", "answer", "distill", "run"])
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from icl_ssm import atomic
    from icl_ssm.provenance import provenance

    prov = provenance("python tools/kill_resume.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="kill-resume-"))
    env = environment(root / "cache")
    kills: list[dict[str, Any]] = []
    references: dict[str, dict[str, Any]] = {}
    try:
        cmds = commands(*prepare(root, env))
        for name in args.commands:
            argv_ = cmds[name]
            first, second = root / name / "reference", root / name / "twin"
            rc1, seconds, err = invoke(argv_, first, env)
            rc2, _, err2 = invoke(argv_, second, env)
            if rc1 or rc2:
                raise SystemExit(f"{name}: the uninterrupted run failed: {err or err2}")
            references[name] = {"seconds": seconds, "files": len(files(first) )}
            print(f"{name}: uninterrupted {seconds:.1f} s, {len(files(first))} files", file=sys.stderr)
            for i in range(args.kills):
                out = root / name / f"kill-{i}"
                for _ in range(10):  # a draw the command outlived is drawn again, on a fresh --out
                    delay = seconds * rng.uniform(args.earliest, 1.0)
                    at = killed(argv_, out, env, delay)
                    if at["killed"]:
                        break
                    shutil.rmtree(out)
                rc, rerun_seconds, rerun_err = invoke(argv_, out, env)
                problems = compare(first, second, out) if rc == 0 else [f"rerun exit {rc}: {rerun_err[-400:]}"]
                kills.append({"command": name, "delay_seconds": round(delay, 2), **at,
                              "rerun_exit": rc, "rerun_seconds": round(rerun_seconds, 1), "differences": problems})
                print(f"{name} kill {i}: at {delay:.1f} s ({len(at['held'])} files), rerun exit {rc}, "
                      f"{len(problems)} differences", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    fired = [k for k in kills if k["killed"]]
    summary = {"kills": len(fired), "attempts": len(kills),
               "reruns_completed": sum(k["rerun_exit"] == 0 for k in kills),
               "identical": sum(not k["differences"] for k in kills),
               "identical_after_a_kill": sum(not k["differences"] for k in fired)}
    atomic.write_json(args.record, {"provenance": prov, "settings": vars(args), "uninterrupted": references,
                                    "summary": summary, "kills": kills})
    print(json.dumps(summary))
    return 0 if summary["identical"] == len(kills) and summary["reruns_completed"] == len(kills) else 1


if __name__ == "__main__":
    sys.exit(main())
