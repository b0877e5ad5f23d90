"""How much of the dense subset ranking do the last demonstrations carry?

    python scripts/recency.py REPORT.json [--last 1 2 4 8] [--windows 32 64 128 256]

REPORT.json: an ``icl-ssm fidelity --json`` report (its held-out subsets and dense subset
losses are reused). For each r in --last, every subset's prompt is cut to its last r
demonstrations and evaluated densely on the same queries; for each n in --windows, the
untrained window cache (the sinks + the last n prompt tokens) of the full prompt. Prints the
Spearman correlation of each with the full dense subset loss: the ranking an exact cache of
that size could reach with no summary of the rest, i.e. what a hybrid's recent part gives
for free and what its compressed part has to add.
"""

import argparse
import json

import numpy as np
from rich.console import Console
from rich.progress import Progress

from icl_ssm import cache as K
from icl_ssm import fidelity as FI
from icl_ssm import prompts as P
from icl_ssm import tasks as T
from icl_ssm.models import load_model, resolve_device


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report")
    ap.add_argument("--last", type=int, nargs="*", default=[1, 2, 4, 8])
    ap.add_argument("--windows", type=int, nargs="*", default=[32, 64, 128, 256])
    ap.add_argument("--num-sink", type=int, default=4)
    args = ap.parse_args()
    r = json.load(open(args.report))
    cfg = r["config"]
    model, tok = load_model(cfg["model"], device=resolve_device())
    task = T.get_task(cfg["task"])
    splits = T.split(task, seed=r["seed"])
    queries = splits.validation[: r["queries"]]
    builder = P.PromptBuilder.for_model(model, tok, task, chat=cfg["chat"])
    ids = r["per_subset"]["ids"]
    dense = np.array(r["per_subset"]["loss"]["dense"])
    kw = dict(loss=cfg["loss"], batch=cfg["batch"], query_batch=cfg["query_batch"])
    rows = []
    stderr = Console(stderr=True)
    bar = Progress(console=stderr, transient=True)
    job = bar.add_task("subset evaluations", total=len(ids) * (len(args.last) + bool(args.windows)))

    def advance(n: int) -> None:
        bar.advance(job, n)
        if not stderr.is_terminal:  # a log file gets a line per batch instead of a live bar
            done = bar.tasks[0]
            stderr.print(f"recency: {int(done.completed)}/{int(done.total)} subset evaluations, {done.elapsed:.0f} s")

    kw["progress"] = advance
    bar.start()
    for last in args.last:
        prefixes = [builder.build_prefix([splits.pool[i] for i in s[-last:]]) for s in ids]
        ev, _ = FI.evaluate_paths(model, builder, prefixes, queries,
                                  {"dense": lambda i, m: K.exact_cache(model, i, m)}, **kw)["dense"]
        rows.append((f"dense prompt of the last {last} demonstration(s)", ev.subset_loss().numpy(),
                     float(ev.prompt_length.float().mean())))
    if args.windows:
        prefixes = [builder.build_prefix([splits.pool[i] for i in s]) for s in ids]
        paths = {"dense": lambda i, m: K.exact_cache(model, i, m)}
        for n in args.windows:
            paths[f"w{n}"] = lambda i, m, n=n: K.window_cache(model, i, m, args.num_sink, n, "compressed")
        out = FI.evaluate_paths(model, builder, prefixes, queries, paths, **kw)
        full = out["dense"][0].subset_loss().numpy()
        assert np.allclose(full, dense, atol=1e-3), "the report's dense losses are not reproduced"
        for n in args.windows:
            rows.append((f"window: {args.num_sink} sinks + last {n} tokens", out[f"w{n}"][0].subset_loss().numpy(),
                         args.num_sink + n))
    bar.stop()
    print(f"{r['task']}, k = {r['k']}: {len(ids)} subsets x {r['queries']} queries; "
          f"full prompt {r['prompt_tokens_mean']:.0f} tokens on average\n")
    print("| exact cache | tokens | Spearman with the full dense loss | 95% CI |\n|---|---:|---:|---:|")
    for name, loss, tokens in rows:
        lo, hi = FI.spearman_ci(loss, dense)
        print(f"| {name} | {tokens:.0f} | {FI.spearman(loss, dense):+.2f} | [{lo:+.2f}, {hi:+.2f}] |")


if __name__ == "__main__":
    main()
