"""How much of the dense subset ranking do the last demonstrations carry?

    python research/recency.py REPORT.json [--last 1 2 4 8] [--windows 32 64 128 256] [--out ROWS.json]

REPORT.json: an ``icl-ssm fidelity --json`` report (its held-out subsets and dense subset
losses are reused). For each r in --last, every subset's prompt is cut to its last r
demonstrations and evaluated densely on the same queries; for each n in --windows, the
untrained window cache (the sinks + the last n prompt tokens) of the full prompt. Prints the
Spearman correlation of each with the full dense subset loss: the ranking an exact cache of
that size could reach with no summary of the rest, i.e. what a hybrid's recent part gives
for free and what its compressed part has to add. The windows also get the fidelity
metrics of ``icl-ssm fidelity`` (KL, logit error, accuracy, FLOPs per subset) against the
full dense prompt: how many exact tokens each of issue 5's targets takes. ``--out`` writes
every row as JSON.
"""

import argparse
import json

import numpy as np
import torch
from rich.console import Console
from rich.progress import Progress

from icl_ssm import atomic
from icl_ssm.compress.cache import dense_cache, window_cache
from icl_ssm.evaluate.fidelity_report import fidelity_report, report_setting
from icl_ssm.evaluate.paths import evaluate_paths
from icl_ssm.evaluate.stats import spearman, spearman_ci
from icl_ssm.lm.models import load_model, resolve_device


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report")
    ap.add_argument("--last", type=int, nargs="*", default=[1, 2, 4, 8])
    ap.add_argument("--windows", type=int, nargs="*", default=[32, 64, 128, 256])
    ap.add_argument("--num-sink", type=int, default=4)
    ap.add_argument("--out", help="write every row (and the windows' fidelity metrics) to this JSON file")
    args = ap.parse_args()
    r = json.load(open(args.report))
    cfg = r["config"]
    model, tok = load_model(cfg["model"], device=resolve_device())
    setting = report_setting(r, model, tok)
    builder, queries, ids, dense = setting.builder, setting.queries, setting.subsets, setting.dense
    task = builder.task
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
        prefixes = [builder.build_prefix([setting.pool[i] for i in s[-last:]]) for s in ids]
        ev, _ = evaluate_paths(model, builder, prefixes, queries,
                                  {"dense": lambda i, m: dense_cache(model, i, m)}, **kw)["dense"]
        rows.append((f"dense prompt of the last {last} demonstration(s)", ev.subset_loss().numpy(),
                     float(ev.prompt_length.float().mean())))
    windows = {}
    if args.windows:
        prefixes = setting.prompts
        paths = {"dense": lambda i, m: dense_cache(model, i, m)}
        for n in args.windows:
            paths[f"w{n}"] = lambda i, m, n=n: window_cache(model, i, m, args.num_sink, n, "compressed")
        out = evaluate_paths(model, builder, prefixes, queries, paths, **kw)
        full = out["dense"][0].subset_loss().numpy()
        assert np.allclose(full, dense, atol=1e-3), "the report's dense losses are not reproduced"
        labels = [builder.label_index(q) for q in queries] if task.kind == "classification" else None
        for n in args.windows:
            ev, agreement = out[f"w{n}"]
            windows[n] = fidelity_report(out["dense"][0], ev, agreement, labels=labels)
            rows.append((f"window: {args.num_sink} sinks + last {n} tokens", ev.subset_loss().numpy(),
                         args.num_sink + n))
    bar.stop()
    print(f"{r['task']}, k = {r['k']}: {len(ids)} subsets x {r['queries']} queries; "
          f"full prompt {r['prompt_tokens_mean']:.0f} tokens on average\n")
    print("| exact cache | tokens | Spearman with the full dense loss | 95% CI |\n|---|---:|---:|---:|")
    result = []
    for name, loss, tokens in rows:
        lo, hi = spearman_ci(loss, dense)
        print(f"| {name} | {tokens:.0f} | {spearman(loss, dense):+.2f} | [{lo:+.2f}, {hi:+.2f}] |")
        result.append({"cache": name, "tokens": float(tokens), "subset_loss_spearman": spearman(loss, dense),
                       "subset_loss_spearman_ci95": [lo, hi], "subset_loss": loss.tolist()})
    if windows:
        first = next(iter(windows.values()))
        print(f"\nWindows against the full dense prompt (dense accuracy {first['acc_dense']:.3f}, "
              f"{first['flops_dense'] / 1e9:.0f} GFLOP per subset):\n")
        print("| window tokens | share of the prompt | Spearman (balanced) | KL | rel logit err | accuracy | "
              "GFLOP per subset |\n|---:|---:|---:|---:|---:|---:|---:|")
        for n, f in windows.items():
            print(f"| {n} | {n / r['prompt_tokens_mean']:.0%} | {f['subset_loss_spearman']:+.2f} "
                  f"({f.get('subset_loss_spearman_balanced') or float('nan'):+.2f}) | {f['kl']:.3f} | "
                  f"{f['rel_logit_err']:.3f} | {f['acc_compressed']:.3f} | {f['flops_compressed'] / 1e9:.0f} |")
    if args.out:
        atomic.write_json(args.out, {"report": args.report, "task": r["task"], "k": r["k"], "subsets": len(ids),
                                     "queries": r["queries"], "prompt_tokens_mean": r["prompt_tokens_mean"],
                                     "dense_subset_loss": dense.tolist(), "rows": result,
                                     "windows": {str(n): f for n, f in windows.items()},
                                     "threads": torch.get_num_threads()})

if __name__ == "__main__":
    main()
