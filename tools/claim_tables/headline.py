"""docs/results.md's 'In one table': one row per headline claim, each from the records behind it.

Reads the records the BENCHMARKS tables it sums up read: the cost (``select-cost-attention.json``), the
ranking fidelity at k = 20 and 50, selection quality (``bench select-order``), the prompt search at equal
time, the pre-registered trust runs and the synthetic regression; their readers come from
:mod:`.selection`, :mod:`.fidelity` and :mod:`.trust`.
"""

from __future__ import annotations

import statistics

from .base import RESULTS, Records, ci, mean_sd, pct, sd, table
from .fidelity import k20_paths, k20_seeds
from .selection import METHODS, orders_averaged, test_size
from .trust import EQUAL_TIME, PLANNED_RUNS, SCREEN_NAMES, equal_time, named, shown_worse, trust_counts

TASK_NAMES = {"rotten_tomatoes": "Rotten Tomatoes"}


def headline_results(records: Records, depth: int = 1) -> str:
    """docs/results.md's 'In one table'; ``depth``: the page's folders below the root (its record links)."""

    def link(name: str) -> str:
        return records.link(name, depth)

    rows = []

    cost = records("select-cost-attention.json")
    by = {(r["k"], r["evaluator"]): r for r in cost["rows"]}
    rows.append([
        "cost of scoring a subset, k = 50",
        f"{by[50, 'dense']['flops_vs_compressed']:.1f}x fewer FLOPs than a dense prefix shared by the queries "
        f"({by[50, 'dense-packed']['flops_vs_compressed']:.1f}x, both packed)",
        f"dense per query: {by[50, 'dense-per-query']['flops_vs_compressed']:.1f}x more",
        f"FLOPs counted (attention included), {cost['queries']} queries, the shipped k = 20 compressor (36 slots) "
        "read at k = 50; counts do not vary between runs; "
        + link("select-cost-attention.json")])

    g0, _ = k20_seeds(records)
    seeds, controls = k20_paths(records, "subset_loss_spearman")
    rows.append([
        "subset ranking vs dense (Spearman), k = 20, 36 slots",
        f"{statistics.fmean(seeds):.2f} ± {sd(seeds):.2f} (3 training seeds; shipped: {seeds[0]:.2f} "
        f"{ci(g0['subset_loss_spearman_ci95'])})",
        f"prompt-independent control {statistics.fmean(controls):.2f} ± {sd(controls):.2f}; "
        f"window {g0['window_subset_loss_spearman']:.2f}",
        f"{g0['subsets']} held-out subsets x {g0['queries']} queries; interval resamples subsets; ± sample sd "
        f"over training seeds; {link('ssm-input-rotten_tomatoes-k20.json')}, {link('seeds-rotten_tomatoes-k20.json')}"])

    big = records("ssm-input-rotten_tomatoes-k50-96x64.json")
    s0 = records("k50-recent128-rotten_tomatoes.json")
    s1 = records("k50-recent128-seed1-rotten_tomatoes.json")
    rows.append([
        "subset ranking vs dense (Spearman), k = 50, 148 slots",
        f"shipped: {big['subset_loss_spearman']:.2f} {ci(big['subset_loss_spearman_ci95'])} on "
        f"{big['subsets']} x {big['queries']}; {s0['subset_loss_spearman']:.2f} and {s1['subset_loss_spearman']:.2f} "
        f"(2 training seeds) on {s0['subsets']} x {s0['queries']}",
        f"control {big['control_subset_loss_spearman']:.2f}, window {big['window_subset_loss_spearman']:.2f} "
        f"({big['subsets']} x {big['queries']}); control {s0['control_subset_loss_spearman']:.2f}, "
        f"{s1['control_subset_loss_spearman']:.2f}, window {s0['window_subset_loss_spearman']:.2f} "
        f"({s0['subsets']} x {s0['queries']})",
        f"held-out subsets x queries; interval resamples subsets; {link('ssm-input-rotten_tomatoes-k50-96x64.json')}, "
        f"{link('k50-recent128-rotten_tomatoes.json')}, {link('k50-recent128-seed1-rotten_tomatoes.json')}"])

    def selection_row(measure: str, name: str, ours: list[str], beside: list[str], extra: dict | None = None) -> None:
        order = records(name)
        acc = orders_averaged(order)
        if extra:
            acc.update(extra)
        fmt = lambda ms: "; ".join(f"{METHODS[m]} {mean_sd(acc[m])}" for m in ms if m in acc)  # noqa: E731
        rows.append([measure, fmt(ours), fmt(beside),
                     f"{test_size(order, records)} (accuracy averaged over the orders, then mean ± sample sd over "
                     f"seeds); {link(name)}"])

    bridge = orders_averaged(records("select-order-k20-bridge-gradce.json"))
    selection_row("selection, k = 20, pool 100 (test accuracy, %)", "select-order-perm8-k20-rotten_tomatoes.json",
                  ["affinity", "affinity:dense"], ["random", "topk", "bm25", "bridge"],
                  {"bridge": bridge["bridge:dense"]})
    selection_row("selection, k = 20, `--per-label` (test accuracy, %)",
                  "select-order-perm8-k20-per-label-rotten_tomatoes.json",
                  ["affinity", "affinity:dense"], ["random", "topk", "bm25"])
    selection_row("selection, k = 50, pool 200 (test accuracy, %)", "select-order-perm8-k50-rotten_tomatoes.json",
                  ["affinity", "affinity:dense"], ["random", "topk", "bm25"])

    pooled, _, by, tasks, examples = equal_time(records)
    budgets = {float(m): t for m, t in pooled["summary"]["budgets"].items()}
    decision = pooled["summary"]["decision"]["default_screen"]

    def arm(s: dict, name: str) -> str:
        vs = s[name]["vs_cheapest"]
        return f"{name} {100 * vs['mean']:+.1f} {ci([100 * c for c in vs['ci95']], '+.1f')}"

    rows.append([
        "prompt search at equal time: a screen before the dense confirmation, minus no screen (points)",
        "; ".join(f"{m:g} min: {arm(s, 'compressed')}, {arm(s, 'control')}" for m, s in budgets.items()),
        "no screen: " + "; ".join(f"{m:g} min " + ", ".join(f"{TASK_NAMES.get(t, t)} {pct(by[t, m]['none']['mean'])}"
                                                              for t in tasks) for m in budgets)
        + f" test accuracy; the pre-registered rule gives {SCREEN_NAMES.get(decision, decision)}",
        f"{' and '.join(TASK_NAMES.get(t, t) for t in tasks)}, {budgets[max(budgets)]['none']['runs'] // len(tasks)} "
        f"seeds each at {' and '.join(f'{m:g}' for m in budgets)} min, {examples} test examples; interval "
        f"resamples (task, seed) runs and examples; {link(EQUAL_TIME)}, "
        + ", ".join(link(n) for n in pooled["records"])])

    runs = [r for _, r in records.glob("trust-search/*.json")]
    if runs:
        c, worse = trust_counts(runs), shown_worse(runs)
        tasks = sorted({r["task"] for r in runs})
        rows.append([
            "`run`'s handed-over prompt on unseen seeds (pre-registered: seeds 5-9, 3 tasks)",
            f"at or above 12 of its 16 plain random prompts in {c['at_or_above_three_quarters']} of {c['runs']} runs "
            f"(at or above 8 of them in {c['at_or_above_median']}); at or above the best retrieval prompt in "
            f"{c['at_or_above_retrieval']}; shown better than the median random prompt in {c['shown_better_rt_cr']} "
            f"of the {c['runs_rt_cr']} Rotten Tomatoes and cr runs; shown worse than it in {len(worse)}{named(worse)}",
            "16 plain random prompts, bm25, topk and per-query bm25 per run, on the same test examples",
            (f"{c['runs']} of {PLANNED_RUNS} runs finished" if c["runs"] < PLANNED_RUNS else f"{c['runs']} runs")
            + f" ({', '.join(tasks)}); 400 test examples each; "
            f"[records]({'../' * depth}{RESULTS}/trust-search/)"])

    if (records.root / RESULTS / "calibration/calibrate-equal-time.json").is_file():
        rows.append(calibration_row(records, depth))

    syn = records("synthetic-products-select-k20.json")
    q64 = records("synthetic-products-fidelity-q64.json")
    q16 = records("synthetic-products-fidelity-q16.json")
    s = {r["method"]: r for r in syn["summary"]}
    rows.append([
        "synthetic regression, k = 20: SSM on products of neighbouring tokens (`--pair-size`)",
        f"subset ranking {q64['compressed']['spearman']:.2f} at {q64['queries']} queries "
        f"({q16['compressed']['spearman']:.2f} at {q16['queries']}); selection test MSE "
        f"{s['affinity-compressed']['mse']:.3f} (dense evaluator {s['affinity-dense']['mse']:.3f})",
        f"control {q64['control']['spearman']:.2f}, window {q64['window']['spearman']:.2f}; random prompt "
        f"{s['random']['mse']:.3f}, topk {s['topk']['mse']:.3f}",
        f"{q64['subsets']} subsets; MSE mean over {s['random']['seeds']} seeds; "
        f"{link('synthetic-products-select-k20.json')}, "
        f"{link('synthetic-products-fidelity-q64.json')}, {link('synthetic-products-fidelity-q16.json')}"])
    return table(["measure", "icl-ssm", "beside it", "rests on"], rows)


def calibration_row(records: Records, depth: int = 1) -> list[str]:
    """The pre-registered equal-time experiment of calibration and selection, as one row."""
    data = records("calibration/calibrate-equal-time.json")
    arms, d = data["summary"]["arms"], data["summary"]["decision"]
    cfg = data["config"]

    def arm(name: str) -> str:
        e = arms[name]
        vs = e.get("vs_best")
        diff = "" if vs is None else f", {100 * vs['mean']:+.1f} {ci([100 * c for c in vs['ci95']], '+.1f')} vs best"
        return f"{name} {100 * e['mean']:.1f} (raw {100 * e['raw_mean']:.1f}; {e['wall_mean']:.0f} s{diff})"

    searches = [n for n in arms if n.startswith("raw-search")]
    return [
        "calibrate, then select: test accuracy at each arm's own cost (pre-registered; %)",
        f"{arm(d['best'])}; run's default by the rule: {d['default']}"
        + ("" if d["default"] == d["best"] else f" ({arm(d['default'])})"),
        "; ".join(arm(n) for n in searches) + f"; {arm('calibrated-zero-shot')}",
        f"{', '.join(cfg['tasks'])}, seeds {', '.join(map(str, cfg['seeds']))}, {cfg['test_size']} test examples; "
        "interval resamples (task, seed) runs and test examples; "
        + records.link("calibration/calibrate-equal-time.json", depth)]
