"""How often the fidelity verdict lets compressed caches stand in for the dense prompt, simulated on a stored report.

    python research/verdict_simulation.py docs/results/ssm-input-rotten_tomatoes-k50-96x64.json OUT.json \
        --sizes 30x4 30x8 60x16 60x32 --draws 200 --seed 0

The stored fidelity report keeps every path's ``(S, Q)`` per-query losses (dense prompt, shipped
compressor, control, window) and per-subset accuracies (:func:`stored_paths` reads a correctness
grid back from them). Each draw plants a compressed path in it (a scenario below), then builds the
keys of a fidelity report on ``subsets x queries`` of the stored subsets and queries, both drawn
without replacement (:func:`simulated_report`), and reads it with both rules. Scenarios:

- **a**: constant losses (the same loss after every prompt), the dense prompt's answers: ranks nothing;
- **b**: the stored compressor, its answers 10 points below the dense prompt's;
- **c**: ranks at Spearman 0.8 with the dense prompt, the dense prompt's answers 2 points down;
- **c'**: as c, with the stored compressor's answers set to 2 points below the dense prompt's;
- **d**: ranks at Spearman 0.4, below the control's on the stored report (``source_subset_loss_spearman``
  in the record), the dense prompt's answers.

a, b and d should fail; c and c' are close to the dense prompt and may pass. For each scenario and
size, the share of draws in which the current rule (:func:`icl_ssm.evaluate.verdict.fidelity_verdict`)
and the rule before it (:func:`old_rule`) answer ``compressed``, and the share in which each check
does not fail.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from icl_ssm import atomic
from icl_ssm.evaluate.stats import bootstrap_spearman, finite_or_none, interval, spearman, spearman_ci
from icl_ssm.evaluate.verdict import fidelity_verdict, paired_accuracy_gap

PATHS = ("dense", "compressed", "control", "window")
Grids = dict[str, np.ndarray]  # path -> (S, Q) losses or 0/1 correctness
Plant = Callable[[Grids, Grids, np.random.Generator], tuple[Grids, Grids]]


def stored_paths(record: dict[str, Any]) -> tuple[Grids, Grids]:
    """Every path's ``(S, Q)`` losses and correctness in a stored fidelity report.

    The report keeps losses per query but accuracies per subset: a query's answer is read as correct
    when its loss (the gold answer's NLL) is below the path's quantile at its stored accuracy."""
    per_subset = record["per_subset"]
    loss = {p: np.array(per_subset["query_loss"][p], dtype=np.float64) for p in PATHS}
    correct = {p: loss[p] < np.quantile(loss[p], np.mean(per_subset["acc"][p])) for p in PATHS}
    return loss, correct


def plant_accuracy(correct: np.ndarray, reference: np.ndarray, gap: float, rng: np.random.Generator) -> np.ndarray:
    """``correct`` (``(S, Q)`` bool) with answers flipped at random until its accuracy is exactly
    ``reference``'s + ``gap`` (to one answer)."""
    out = correct.copy()
    n = round((out.mean() - reference.mean() - gap) * out.size)  # > 0: correct answers to turn wrong
    flip = rng.choice(np.flatnonzero(out.ravel() == (n > 0)), size=abs(n), replace=False)
    out.ravel()[flip] = ~out.ravel()[flip]
    return out


def plant_ranking(dense: np.ndarray, noise: np.ndarray, target: float, rng: np.random.Generator) -> np.ndarray:
    """``a * dense + (1 - a) * noise[shuffled subsets]``, all ``(S, Q)`` losses, with ``a`` the weight (to
    1/4096) at which the subset losses reach a Spearman of ``target`` with ``dense``'s."""
    noise = noise[rng.permutation(len(noise))]
    lo, hi = 0.0, 1.0  # the Spearman grows with a, from the noise's to 1
    for _ in range(12):
        mid = (lo + hi) / 2
        reached = spearman(dense.mean(1), (mid * dense + (1 - mid) * noise).mean(1)) >= target
        lo, hi = (lo, mid) if reached else (mid, hi)
    return hi * dense + (1 - hi) * noise


def _constant(loss: Grids, correct: Grids, rng: np.random.Generator) -> tuple[Grids, Grids]:
    return {**loss, "compressed": np.full_like(loss["compressed"], 0.7)}, {**correct, "compressed": correct["dense"]}


def _ten_points_worse(loss: Grids, correct: Grids, rng: np.random.Generator) -> tuple[Grids, Grids]:
    return loss, {**correct, "compressed": plant_accuracy(correct["compressed"], correct["dense"], -0.10, rng)}


def _close(answers: str) -> Plant:
    def plant(loss: Grids, correct: Grids, rng: np.random.Generator) -> tuple[Grids, Grids]:
        close = plant_ranking(loss["dense"], loss["compressed"], 0.8, rng)
        return {**loss, "compressed": close}, {**correct, "compressed": plant_accuracy(
            correct[answers], correct["dense"], -0.02, rng)}
    return plant


def _below_control(loss: Grids, correct: Grids, rng: np.random.Generator) -> tuple[Grids, Grids]:
    worse = plant_ranking(loss["dense"], loss["compressed"], 0.4, rng)
    return {**loss, "compressed": worse}, {**correct, "compressed": correct["dense"]}


# name -> (what is planted, plant(loss, correct, rng) -> (loss, correct) with the compressed path replaced)
SCENARIOS: dict[str, tuple[str, Plant]] = {
    "a": ("constant losses, the dense prompt's answers", _constant),
    "b": ("the stored compressor, answers 10 points worse", _ten_points_worse),
    "c": ("Spearman 0.8, the dense prompt's answers 2 points down", _close("dense")),
    "c'": ("Spearman 0.8, the stored compressor's answers at 2 points down", _close("compressed")),
    "d": ("Spearman 0.4 (below the control), the dense prompt's answers", _below_control),
}


def simulated_report(loss: Grids, correct: Grids, rng: np.random.Generator, subsets: int, queries: int,
                     resamples: int = 200, over_subsets: bool = True) -> dict[str, Any]:
    """The keys of a fidelity report on ``subsets`` of the stored subsets and ``queries`` of its queries,
    both drawn without replacement, computed as ``fidelity_report`` and ``paired_spearman`` compute them:
    Spearman intervals over subsets and queries (``*_ci95_queries``, the current rule's) and, with
    ``over_subsets``, over subsets alone (``*_ci95``, the old rule's), each from ``resamples`` draws;
    per-subset accuracies."""
    rows = rng.choice(len(loss["dense"]), size=subsets, replace=False)
    cols = rng.choice(loss["dense"].shape[1], size=queries, replace=False)
    losses = {p: loss[p][rows][:, cols] for p in PATHS}  # (subsets, queries) each
    acc = {p: correct[p][rows][:, cols].mean(1) for p in ("dense", "compressed")}  # (subsets,) each
    dense = losses.pop("dense")
    rho = {p: spearman(dense.mean(1), x.mean(1)) for p, x in losses.items()}
    both = bootstrap_spearman(dense, losses, resamples=resamples)  # subsets and queries resampled
    r = {"subset_loss_spearman": finite_or_none(rho["compressed"]),
         "subset_loss_spearman_ci95_queries": [finite_or_none(v) for v in interval(both["compressed"])],
         "acc_dense": float(acc["dense"].mean()), "acc_compressed": float(acc["compressed"].mean()),
         "per_subset": {"acc": {p: a.tolist() for p, a in acc.items()}}, "paired": {}}
    for p in ("window", "control"):
        r[f"{p}_subset_loss_spearman"] = finite_or_none(rho[p])
        r["paired"][f"compressed-{p}"] = {
            "diff": finite_or_none(rho["compressed"] - rho[p]),
            "ci95_queries": [finite_or_none(v) for v in interval(both["compressed"] - both[p])]}
    if over_subsets:  # slow (a Spearman per resample); the current rule reads them only where the above are missing
        r["subset_loss_spearman_ci95"] = [finite_or_none(v) for v in spearman_ci(
            dense.mean(1), losses["compressed"].mean(1), resamples=resamples)]
        rows_only = bootstrap_spearman(dense, losses, queries=False, resamples=resamples)
        for p in ("window", "control"):
            r["paired"][f"compressed-{p}"]["ci95"] = [finite_or_none(v) for v in interval(rows_only["compressed"]
                                                                                          - rows_only[p])]
    return r


def reports(loss: Grids, correct: Grids, plant: Plant, size: tuple[int, int], draws: int,
            rng: np.random.Generator, resamples: int = 200, over_subsets: bool = True):
    """``draws`` simulated reports (:func:`simulated_report`) of ``size`` (subsets, queries); before each,
    ``plant`` plants the compressed path anew in the stored grids."""
    for _ in range(draws):
        yield simulated_report(*plant(loss, correct, rng), rng, *size, resamples=resamples, over_subsets=over_subsets)


def old_rule(report: dict[str, Any], max_accuracy_drop: float = 0.05) -> dict[str, bool | None]:
    """The rule before this change (``evaluate/gate.py``'s ``fidelity_gate``, replaced in bc9d03c), kept
    here only for the comparison: a check passes unless shown failed, and a check without its numbers passes.

    ``{check: passed}``, None where its numbers are missing; the old rule answers ``compressed`` unless
    one is False. Spearman intervals over subsets only; no control check; the accuracy interval is
    a paired bootstrap over subsets."""
    rho, ci = report.get("subset_loss_spearman"), report.get("subset_loss_spearman_ci95") or [None, None]
    pair = (report.get("paired") or {}).get("compressed-window") or {}
    window = pair.get("ci95") or [None, None]
    gap = paired_accuracy_gap({"acc": (report.get("per_subset") or {}).get("acc") or {}}, "compressed", "dense")
    return {"ranks held-out subsets": None if rho is None or ci[0] is None else ci[0] > 0,
            "ranks at least as well as the window": None if pair.get("diff") is None or window[1] is None
            else not window[1] < 0,
            "answers like the dense prompt": None if gap is None else not gap["ci95"][1] < -max_accuracy_drop}


def simulate(loss: Grids, correct: Grids, scenario: str, size: tuple[int, int], draws: int, seed: int,
             resamples: int = 200) -> dict[str, Any]:
    """One row: both rules on the same ``draws`` reports of ``size`` planted with ``scenario``."""
    rng = np.random.default_rng([seed, *size, list(SCENARIOS).index(scenario)])
    new_pass, new, old = [], [], []
    for r in reports(loss, correct, SCENARIOS[scenario][1], size, draws, rng, resamples):
        verdict = fidelity_verdict(r)
        new_pass.append(verdict["evaluator"] == "compressed")
        new.append({c["name"]: c["passed"] for c in verdict["checks"]})
        old.append(old_rule(r))

    def not_failed(runs: list[dict[str, bool | None]]) -> dict[str, float]:  # check -> share of draws
        return {name: float(np.mean([run[name] is not False for run in runs])) for name in runs[0]}

    return {"scenario": scenario, "planted": SCENARIOS[scenario][0], "subsets": size[0], "queries": size[1],
            "draws": draws, "new_pass_rate": float(np.mean(new_pass)),
            "old_pass_rate": float(np.mean([False not in run.values() for run in old])),
            "new_checks_not_failed": not_failed(new), "old_checks_not_failed": not_failed(old)}


def markdown(rows: list[dict[str, Any]]) -> str:
    """Scenarios down, sizes across; each cell the pass rate under the new rule / the old one."""
    sizes = list(dict.fromkeys(f"{r['subsets']}x{r['queries']}" for r in rows))
    cell = {(r["scenario"], f"{r['subsets']}x{r['queries']}"): f"{r['new_pass_rate']:.2f} / {r['old_pass_rate']:.2f}"
            for r in rows}
    lines = ["| scenario | " + " | ".join(f"{s} new / old" for s in sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
    for name in dict.fromkeys(r["scenario"] for r in rows):
        lines.append(f"| {name}: {SCENARIOS[name][0]} | " + " | ".join(cell.get((name, s), "") for s in sizes) + " |")
    return "\n".join(lines)


def size_arg(text: str) -> tuple[int, int]:
    try:
        subsets, queries = (int(v) for v in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r}; expected SUBSETSxQUERIES, e.g. 30x4") from None
    return subsets, queries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("record", help="a fidelity report with per_subset.query_loss and per_subset.acc")
    ap.add_argument("out")
    ap.add_argument("--sizes", type=size_arg, nargs="+", default=[(30, 4), (30, 8), (60, 16), (60, 32)])
    ap.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--resamples", type=int, default=200, help="bootstrap draws of each simulated report's intervals")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    loss, correct = stored_paths(json.loads(open(args.record).read()))
    S, Q = loss["dense"].shape
    for subsets, queries in args.sizes:
        if not (3 <= subsets <= S and 1 <= queries <= Q):
            ap.error(f"--sizes {subsets}x{queries}: the record has {S} subsets x {Q} queries; expected 3..{S} "
                     f"subsets and 1..{Q} queries")
    t0 = time.perf_counter()
    rows = []
    for size in args.sizes:
        for scenario in args.scenarios:
            rows.append(simulate(loss, correct, scenario, size, args.draws, args.seed, args.resamples))
            print(json.dumps(rows[-1]), flush=True)
    rho = {p: spearman(loss["dense"].mean(1), loss[p].mean(1)) for p in PATHS[1:]}
    command = shlex.join(["python", "research/verdict_simulation.py", args.record, args.out, "--sizes",
                          *(f"{s}x{q}" for s, q in args.sizes),
                          *([] if args.scenarios == list(SCENARIOS) else ["--scenarios", *args.scenarios]),
                          "--draws", str(args.draws), "--resamples", str(args.resamples), "--seed", str(args.seed)])
    atomic.write_json(args.out, {
        "command": command, "source": args.record, "source_subsets": S, "source_queries": Q,
        "source_subset_loss_spearman": rho, "source_accuracy": {p: float(c.mean()) for p, c in correct.items()},
        "sizes": [f"{s}x{q}" for s, q in args.sizes], "scenarios": {n: SCENARIOS[n][0] for n in args.scenarios},
        "draws": args.draws, "resamples": args.resamples, "seed": args.seed,
        "rows": rows, "seconds": time.perf_counter() - t0})
    print(markdown(rows))


if __name__ == "__main__":
    main()
