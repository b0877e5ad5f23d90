"""BENCHMARKS' 'Synthetic in-context regression': selection, fidelity and the probe on the synthetic task.

Reads the ``icl-ssm synthetic select`` records (test MSE per k, method and seed, :func:`synthetic_mse`, and
the D1 share of the pick) of the linear teacher at k = 20 and k = 5-60 and of the ReLU teacher, the
``synthetic fidelity`` records of the products and embeddings caches, and the flipped-target probe.
:func:`from_k` finds the k from which a statement holds at every larger k measured.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable

from .base import Records, ci, cite, mean_sd, table


def synthetic_mse(record: dict) -> dict[tuple[int, str], list[float]]:
    """Per ``(k, method)`` of a ``synthetic select`` record, the test MSE of each seed."""
    out = defaultdict(list)
    for r in sorted(record["rows"], key=lambda r: (r["k"], r["seed"])):
        for method in ("random", "topk", "affinity-dense", "affinity-compressed"):
            out[r["k"], method].append(r[method]["mse"])
    return dict(out)


def mse(values: list[float]) -> str:
    return mean_sd(values, 1, 3)


def from_k(ks: list[int], holds: Callable[[int], bool]) -> int | None:
    """The smallest k from which ``holds`` is true at every larger k measured (None if not at the largest)."""
    first = None
    for k in sorted(ks, reverse=True):
        if not holds(k):
            break
        first = k
    return first


def synthetic(records: Records) -> str:
    """BENCHMARKS' 'Synthetic in-context regression'."""
    m = lambda values: statistics.fmean(values)  # noqa: E731
    name = "synthetic-products-select-k20.json"
    sel = records(name)
    acc = synthetic_mse(sel)
    seeds = len(acc[20, "random"])
    dense, comp = acc[20, "affinity-dense"], acc[20, "affinity-compressed"]
    gap = m(comp) / m(dense) - 1
    met = gap <= 0.10 and max(m(dense), m(comp)) < min(m(acc[20, "random"]), m(acc[20, "topk"]))
    share = {method: statistics.fmean(r[method]["d1_share"] for r in sel["rows"])
             for method in ("affinity-dense", "affinity-compressed")}
    products = ("[products](docs/research/ssm-input.md#products-of-neighbouring-tokens), [synthetic]"
                "(docs/research/synthetic-regression.md#compressors-for-the-linear-teacher-and-selection-with-them-2026-11-26)")
    rows = [[
        f"test MSE, k = 20, {seeds} seeds ({sel['subsets']} subsets x {sel['queries']} validation queries each)",
        "`icl-ssm synthetic select --teacher T --compressor C --k 20 --seeds 0 1 2 3 4 --out O`",
        f"affinity dense {mse(dense)}; **products {mse(comp)}** (within {gap:.0%}); random {mse(acc[20, 'random'])}, "
        f"top-k {mse(acc[20, 'topk'])}",
        f"compressed within 10% of dense, both below random and top-k: **{'met' if met else 'not met'}**",
        cite(records, products, name)]]
    rows.append([
        f"D1 share of the pick, k = 20, {seeds} seeds", "same",
        f"dense {share['affinity-dense']:.2f}, products {share['affinity-compressed']:.2f} "
        f"(pool {sel['d1_share']:.2f})",
        f"compressed >= 0.90: {'met' if share['affinity-compressed'] >= 0.9 else 'not met'}"
        + (", and out of reach of mean-loss affinity itself (the dense evaluator's share)"
           if share["affinity-dense"] < 0.9 else ""),
        "same"])
    rows.append(synthetic_k60(records))
    rows.append(synthetic_relu(records))
    rows += synthetic_fidelity(records)
    return table(["measure", "command", "measured", "goal", "record"], rows)


def synthetic_k60(records: Records) -> list[str]:
    """Test MSE against k on the 60-pair linear teacher, one products compressor trained at k = 40."""
    name = "synthetic-products-select-k5-60.json"
    acc = {key: statistics.fmean(v) for key, v in synthetic_mse(records(name)).items()}
    ks = sorted({k for k, _ in acc})
    seeds = len(synthetic_mse(records(name))[ks[0], "random"])
    gap = {k: acc[k, "affinity-compressed"] / acc[k, "affinity-dense"] - 1 for k in ks}
    below = from_k(ks, lambda k: max(acc[k, "affinity-dense"], acc[k, "affinity-compressed"])
                   < min(acc[k, "random"], acc[k, "topk"]))
    close = from_k(ks, lambda k: gap[k] <= 0.10)
    top = ks[-1]
    at = lambda k: f"{acc[k, 'affinity-compressed']:.3f} against {acc[k, 'affinity-dense']:.3f}"  # noqa: E731
    behind = [k for k in ks if k < close and gap[k] > 0.10]
    ahead = [k for k in ks if gap[k] < 0]
    return [
        f"test MSE against k ({ks[0]}-{top}, {seeds} seeds), a teacher trained on up to {top} pairs, one products "
        "compressor trained at k = 40",
        "`icl-ssm synthetic train --max-pairs 60 ...`, `synthetic distill ... --k 40`, "
        "`synthetic select ... --k 5 10 20 30 40 50 60`",
        f"[plot](docs/figures/synthetic-linear-select-k60.png): both affinity evaluators below random and top-k from "
        f"k = {below} on; compressed within {max(gap[k] for k in ks if k >= close):.0%} of dense only from "
        f"k = {close} ("
        + "; ".join(f"k = {k}: {at(k)}" for k in ks if k >= close)
        + f"; random {acc[top, 'random']:.3f}, top-k {acc[top, 'topk']:.3f}), "
        + ", ".join(f"{gap[k]:.0%} behind at k = {k}" + (f" ({at(k)})" if k == behind[-1] else "")
                    for k in reversed(behind) if k >= below)
        + (f", ahead of it at k = {' and '.join(map(str, ahead))}" if ahead else ""),
        "the paper's figure",
        cite(records, "[k up to 60](docs/research/synthetic-regression.md"
                      "#a-teacher-for-k-up-to-60-and-the-selection-study-from-k--5-to-60)", name)]


def synthetic_relu(records: Records) -> list[str]:
    """ReLU functions: a teacher carried from the linear one, test MSE against k, fidelity at 20, 40, 60."""
    names = ("synthetic-teacher-relu-60-evaluation.json", "synthetic-relu-select-k5-60.json",
             "synthetic-relu-fidelity-k20-40-60.json")
    teacher, sel, fid = (records(n) for n in names)
    at40 = next(r for r in teacher["by_k"] if r["k"] == 40)
    per_seed = synthetic_mse(sel)
    acc = {key: statistics.fmean(v) for key, v in per_seed.items()}
    ks = sorted({k for k, _ in acc})
    top = ks[-1]
    margin = 0.05  # about one standard error of a mean over the 5 seeds
    below = {b: from_k(ks, lambda k, b=b: acc[k, b] - acc[k, "affinity-compressed"] > margin)
             for b in ("random", "topk")}
    topk_wins = [k for k in ks if acc[k, "topk"] < acc[k, "affinity-dense"]]
    runs = [fid[f"k{k}"] for k in (20, 40, 60)]
    controls, ranks = [r["control"]["spearman"] for r in runs], [r["compressed"]["spearman"] for r in runs]
    over = [r["paired"]["compressed-control"]["diff"] for r in runs]
    return [
        f"ReLU functions: test MSE against k ({ks[0]}-{top}, {len(per_seed[top, 'random'])} seeds), a teacher carried "
        f"from the 60-pair linear one (`--init-from`, 3,000 steps: {at40['teacher']:.2f} at k = 40, zero "
        f"{at40['zero']:.2f})",
        "`icl-ssm synthetic train --function relu --init-from T ...`, then `distill`, `select` as for linear",
        f"[plot](docs/figures/synthetic-relu-select-k60.png): compressed more than {margin} below random from k = "
        f"{below['random']} and below top-k from k = {below['topk']} (k = {top}: "
        f"{mse(per_seed[top, 'affinity-compressed'])}; top-k {acc[top, 'topk']:.3f}, random {acc[top, 'random']:.3f}, "
        f"dense {acc[top, 'affinity-dense']:.3f}); top-k beats the dense evaluator at k = "
        f"{', '.join(map(str, topk_wins[:-1]))} and {topk_wins[-1]} (near inputs inform a nonlinear function); "
        f"Spearman {' / '.join(f'{x:.2f}' for x in ranks)} at k = 20 / 40 / 60, above the "
        f"control ({min(controls):.2f} to {max(controls):.2f}) by {min(over):+.2f} to {max(over):+.2f}",
        "the paper's ReLU figure",
        cite(records, "[ReLU](docs/research/synthetic-regression.md"
                      "#a-relu-teacher-carried-from-the-linear-one-and-the-relu-figure)", *names)]


def synthetic_fidelity(records: Records) -> list[list[str]]:
    """The k = 20 products cache: ranking at 64 and 16 queries, FLOPs, and the flipped-target probe."""
    names = ("synthetic-products-fidelity-q64.json", "synthetic-products-fidelity-q16.json",
             "synthetic-embeddings-c16-v8-fidelity-q64.json", "synthetic-products-probe.json")
    q64, q16, emb, probe = (records(n) for n in names)
    pages = "[products](docs/research/ssm-input.md#products-of-neighbouring-tokens)"
    sp = lambda r, path="compressed": f"{r[path]['spearman']:.2f} {ci(r[path]['ci95'])}"  # noqa: E731
    over = lambda r, pair: f"{r['paired'][pair]['diff']:+.2f} {ci(r['paired'][pair]['ci95'], '+.2f')}"  # noqa: E731
    met = q64["compressed"]["spearman"] >= 0.8 and q64["paired"]["compressed-control"]["ci95"][0] > 0
    rise = lambda path: (f"{probe[path]['diff']:+.3f} {ci(probe[path]['ci95'], '+.3f')}"  # noqa: E731
                         f", {probe[path]['higher_share']:.0%}")
    confirmed = probe["compressed"]["ci95"][0] > 0 and probe["dense"]["ci95"][0] > 0
    return [
        [f"subset-loss Spearman vs dense, {q64['subsets']} held-out subsets x {q64['queries']} queries",
         "`icl-ssm synthetic fidelity --teacher T --compressor C --control CC`",
         f"**products {sp(q64)}, minus control {over(q64, 'compressed-control')}**, minus window "
         f"{over(q64, 'compressed-window')}; embeddings (same training) {sp(emb)}; control "
         f"{q64['control']['spearman']:.2f}; window {q64['window']['spearman']:.2f}. At {q16['queries']} queries (what "
         f"selection uses): products {sp(q16)}, control {q16['control']['spearman']:.2f}, window "
         f"{q16['window']['spearman']:.2f}; intervals resample the subsets",
         ">= 0.8, above control by a paired interval: "
         + (f"**met** (products, at {q64['queries']} queries)" if met else "**not met**"),
         cite(records, pages, *names[:3])],
        ["FLOPs per evaluated subset, dense / compressed, attention counted", "same",
         f"whole evaluation with {q16['queries']} queries: {q16['flop_ratio']:.1f}x fewer (products); the cache build "
         f"alone: {q64['cache_flop_ratio']:.1f}x (products), {emb['cache_flop_ratio']:.1f}x (embeddings)",
         ">= 10x: " + ("met" if q16["flop_ratio"] >= 10 else "not met"), "same"],
        [f"flipped-target probe: loss rise when every target is another cluster's ({probe['pairs']} pairs)",
         "`icl-ssm synthetic probe --teacher T --compressor C`",
         f"dense {rise('dense')} of pairs; **products {rise('compressed')}**",
         "a section-2 prediction tested: " + ("**confirmed**" if confirmed else "not confirmed"),
         cite(records, pages, "synthetic-products-probe.json")]]
