"""The fidelity verdict `run` gives the shipped compressors, at several fidelity seeds.

    python research/verdict_seeds.py OUT_DIR --seeds 0 1 2 --ks 20 50
    python research/verdict_seeds.py OUT_DIR --task cr --ks 20 --compressor DIR --control DIR

For each shipped Rotten Tomatoes compressor (trained at each of ``--ks``; ``--task``, and
``--compressor`` / ``--control`` for a task none ships for) and each seed: the
fidelity stage exactly as ``icl-ssm run`` runs it (its held-out subset and query counts,
:class:`icl_ssm.pipeline.RunConfig`'s ``fidelity_subsets`` x ``fidelity_queries``, the shipped
control beside it, the seed choosing the subsets), then the verdict
(:func:`icl_ssm.evaluate.verdict.fidelity_verdict`). One JSON per (k, seed) in ``OUT_DIR`` (a
finished one is read back, not redone) and ``OUT_DIR/verdicts.json``: the verdicts, each check with
its value and interval, and the provenance of the run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from icl_ssm import atomic
from icl_ssm.compress.pretrained import find_pretrained
from icl_ssm.evaluate.fidelity import FidelityConfig, run_fidelity
from icl_ssm.evaluate.verdict import fidelity_verdict
from icl_ssm.pipeline import RunConfig
from icl_ssm.provenance import provenance


def one(k: int, seed: int, cfg: RunConfig, task: str, dirs: tuple[str, str] | None = None) -> dict:
    """``dirs``: the compressor and control directories (default: the ones shipped for the task and k)."""
    if dirs is None:
        shipped = find_pretrained(cfg.model, task, k=k)
        if shipped is None:
            raise SystemExit(f"no compressor is shipped for {task} at k = {k}: pass --compressor and --control")
        dirs, name = (str(shipped / "compressor"), str(shipped / "control")), shipped.name
    else:
        name = dirs[0]
    fcfg = FidelityConfig(model=cfg.model, task=task, k=k, compressor=dirs[0],
                          control=dirs[1], subsets=cfg.fidelity_subsets,
                          queries=cfg.fidelity_queries, seed=seed, batch=cfg.batch, query_batch=cfg.query_batch)
    report = run_fidelity(fcfg)
    verdict = fidelity_verdict(report, max_accuracy_drop=cfg.max_accuracy_drop)
    return {"k": k, "seed": seed, "compressor": name, "subsets": fcfg.subsets, "queries": fcfg.queries,
            "verdict": verdict["evaluator"], "checks": verdict["checks"], "summary": verdict["summary"],
            "report": report}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--ks", type=int, nargs="+", default=[20, 50])
    p.add_argument("--task", default="rotten_tomatoes")
    p.add_argument("--compressor", help="a compressor directory (default: the one shipped for the task and k)")
    p.add_argument("--control", help="its control compressor directory (with --compressor)")
    args = p.parse_args(argv)
    if (args.compressor is None) != (args.control is None):
        p.error("--compressor and --control go together")
    dirs = (args.compressor, args.control) if args.compressor else None
    out = atomic.prepare_dir(args.out)
    cfg = RunConfig()
    command = "python research/verdict_seeds.py " + " ".join(argv)
    rows = []
    for k in args.ks:
        for seed in args.seeds:
            path = out / f"k{k}-seed{seed}.json"
            if not path.exists():
                atomic.write_json(path, {**one(k, seed, cfg, args.task, dirs), "provenance": provenance(command)})
            row = json.loads(path.read_text())
            rows.append({key: row[key] for key in ("k", "seed", "compressor", "subsets", "queries", "verdict",
                                                   "checks", "summary", "provenance")})
            print(f"k = {k}, seed {seed}: {row['verdict']} ({row['summary']})", flush=True)
    same = {k: len({r["verdict"] for r in rows if r["k"] == k}) == 1 for k in args.ks}
    atomic.write_json(out / "verdicts.json", {"task": args.task, "seeds": args.seeds, "ks": args.ks,
                                              "same_verdict_at_every_seed": same, "runs": rows,
                                              "provenance": provenance(command)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
