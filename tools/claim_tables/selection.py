"""BENCHMARKS' 'Selection quality' and 'Selection cost', and the readers of selection records.

Selection quality reads the ``bench select-order`` records (each selected set's test accuracy in random
prompt orders: :func:`random_orders`, :func:`orders_averaged`, :func:`one_order`), the order searches of
``research/order_search.py`` (:func:`searched`, :func:`search_gains`), and the headroom, reliability and
estimator records; selection cost reads the ``bench select-cost`` records (FLOPs per scored subset, attention
counted) and the shipped k = 50 compressor's fidelity record. :data:`METHODS` names each method as printed.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from scipy.stats import f_oneway

from .base import BENCH, Records, cite, mean_sd, p_text, paired_p, pct, spearman_brown, table

METHODS = {"affinity": "affinity", "affinity:dense": "dense evaluator", "affinity:rank10": "G-rank10",
           "affinity:si64rank10": "SI64-rank10", "random": "random", "bm25": "bm25", "topk": "topk",
           "bridge": "BRIDGE", "zero-shot": "zero-shot"}
BASELINES = ("random", "bm25", "topk")


def random_orders(order: dict, report: str | None = None) -> dict[tuple[str, int], list[float]]:
    """Per selected set ``(method, seed)``, its test accuracies in the random prompt orders of a
    ``bench select-order`` record (only the sets of ``report`` when the record joins several)."""
    per = defaultdict(list)
    for r in order["rows"]:
        if r["order"] == "random" and report in (None, r["report"]):
            per[r["method"], r["seed"]].append(r["test_accuracy"])
    return dict(per)


def orders_averaged(order: dict, report: str | None = None) -> dict[str, list[float]]:
    """Per method, each seed's test accuracy averaged over its random prompt orders."""
    out = defaultdict(list)
    for (method, _), accs in sorted(random_orders(order, report).items(), key=lambda kv: kv[0][1]):
        out[method].append(statistics.fmean(accs))
    return dict(out)


def one_order(order: dict, name: str, report: str | None = None) -> dict[str, list[float]]:
    """Per method, each seed's test accuracy in the one prompt order ``name`` (score, interleave)."""
    out = defaultdict(list)
    for r in sorted(order["rows"], key=lambda r: r["seed"]):
        if r["order"] == name and report in (None, r["report"]):
            out[r["method"]].append(r["test_accuracy"])
    return dict(out)


def test_size(order: dict, records: Records) -> str:
    seeds = sorted({r["seed"] for r in order["rows"]})
    return f"{order['provenance']['test_examples']} test examples x {len(seeds)} seeds x {order['permutations']} orders"


def searched(search: dict) -> dict[str, list[float]]:
    """Per method, each seed's test accuracy in the order that ``research/order_search.py`` chose."""
    out = defaultdict(list)
    for r in sorted(search["results"], key=lambda r: r["seed"]):
        out[r["method"]].append(r["candidates"][r["chosen"]]["test_accuracy"])
    return dict(out)


def search_gains(search: dict) -> list[tuple[str, int, float]]:
    """Per set ``(method, seed, gain)``: the searched order's test accuracy minus the set's mean over
    the random orders among the candidates (the order averaged out)."""
    out = []
    for r in search["results"]:
        rand = [c["test_accuracy"] for c in r["candidates"] if c["order"] == "random"]
        out.append((r["method"], r["seed"], r["candidates"][r["chosen"]]["test_accuracy"] - statistics.fmean(rand)))
    return out


def ranked(acc: dict[str, list[float]]) -> list[str]:
    """``method mean ± sd`` (in %) for each method, highest mean first."""
    return [f"{METHODS[m]} {mean_sd(acc[m])}" for m in sorted(acc, key=lambda m: -statistics.fmean(acc[m]))]


def against_baselines(acc: dict[str, list[float]]) -> str:
    """The selection target's comparison: both affinity evaluators, random, and the best baseline."""
    best = max(BASELINES, key=lambda m: statistics.fmean(acc[m]))
    return (f"affinity {mean_sd(acc['affinity'])}, dense evaluator {mean_sd(acc['affinity:dense'])}; "
            f"random {mean_sd(acc['random'])}, best baseline {METHODS[best]} {mean_sd(acc[best])}")


def paired_gain(diffs: list[float]) -> str:
    """``+3.8 (paired t-test p = 0.06: not shown beyond chance)``: the mean difference in points, its test."""
    p = paired_p(diffs)
    return (f"{100 * statistics.fmean(diffs):+.1f} (paired t-test p = {p_text(p)}"
            f"{': not shown beyond chance' if p >= 0.05 else ''})")


def selection_quality(records: Records) -> str:
    """BENCHMARKS' 'Selection quality'."""
    rows = []
    page_k20 = ("[prompt order](docs/research/prompt-order.md"
                "#k--20-at-the-demos-scale-the-order-averaged-out-and-searched-3-seeds)")
    k20 = records("select-order-perm8-k20-rotten_tomatoes.json")
    rows.append([
        "k = 20, pool 100, orders averaged (3 seeds)",
        "`icl-ssm bench select-quality --compressor G --k 20 --seeds 0 1 2 --pool-size 100 --queries 8 --subsets 20 "
        "--test-size 150`, then `bench select-order --permutations 8`",
        "CPU, 2 threads",
        f"{against_baselines(orders_averaged(k20))}; {test_size(k20, records)}",
        "+5 over best baseline; compressed within 1 of dense",
        cite(records, page_k20, "select-order-perm8-k20-rotten_tomatoes.json")])

    s20 = records("order-search-k20-rotten_tomatoes.json")
    chosen = searched(s20)
    rows.append([
        "same sets, every method's order searched",
        "`python research/order_search.py SQ.json ORDER.json OUT.json --queries 32 --candidates 10`",
        "CPU, 2 threads",
        f"one order per set, chosen of {s20['candidates']} on {s20['queries']} validation queries: "
        f"{against_baselines(chosen)}; {len(s20['results'])} sets, 3 seeds",
        "—",
        cite(records, page_k20, "order-search-k20-rotten_tomatoes.json")])

    per_label = records("select-order-perm8-k20-per-label-rotten_tomatoes.json")
    averaged, interleaved = orders_averaged(per_label), one_order(per_label, "interleave")
    first, *rest = ranked(averaged)
    top, *others = ranked(interleaved)
    rows.append([
        "k = 20, `--per-label` (3 seeds)",
        "`bench select-quality ... --per-label`, then `bench select-order --permutations 8`",
        "CPU, 2 threads",
        f"orders averaged: {first} leads; {', '.join(rest)}. One order (`interleave`), where "
        f"{top.rsplit(' ', 3)[0]} leads: {top}, {', '.join(others)}; {test_size(per_label, records)}",
        "—",
        cite(records, "[label balance](docs/research/label-balance.md)",
             "select-order-perm8-k20-per-label-rotten_tomatoes.json")])

    cr = records("select-order-perm4-k20-cr.json")
    plain, balanced = random_orders(k20), random_orders(per_label)
    diffs = {k: statistics.fmean(balanced[k]) - statistics.fmean(plain[k]) for k in plain}
    by_seed = [100 * statistics.fmean(d for (_, s), d in diffs.items() if s == seed)
               for seed in sorted({s for _, s in diffs})]
    cr_plain, cr_balanced = random_orders(cr, "sq"), random_orders(cr, "sq-pl")
    cr_diffs = [statistics.fmean(cr_balanced[k]) - statistics.fmean(cr_plain[k]) for k in cr_plain]
    rows.append([
        f"`--per-label` vs plain, orders averaged, {len(diffs)} sets "
        f"({len({m for m, _ in diffs})} methods x {len(by_seed)} seeds)",
        "same", "CPU",
        f"Rotten Tomatoes {paired_gain(list(diffs.values()))}; by seed {', '.join(f'{d:+.1f}' for d in by_seed)}; "
        f"`cr` {paired_gain(cr_diffs)}; each set's mean over {k20['permutations']} random orders "
        f"(`cr`: {cr['permutations']}), 150 test examples",
        "—",
        cite(records, "[label balance](docs/research/label-balance.md)", "select-order-perm8-k20-rotten_tomatoes.json",
             "select-order-perm8-k20-per-label-rotten_tomatoes.json", "select-order-perm4-k20-cr.json")])

    k50 = records("select-order-perm8-k50-rotten_tomatoes.json")
    acc50 = orders_averaged(k50)
    means = [statistics.fmean(v) for v in acc50.values()]
    sets50 = random_orders(k50)
    anova = float(f_oneway(*sets50.values()).pvalue)
    rows.append([
        "k = 50, pool 200, 16 queries, orders averaged (3 seeds)",
        "`bench select-quality --k 50 --pool-size 200 --subsets 40 ...`, then `bench select-order --permutations 8`",
        "CPU, 2 threads",
        f"every method {pct(min(means))}-{pct(max(means))}: affinity (36-slot compressor) "
        f"{mean_sd(acc50['affinity'])}, dense evaluator {mean_sd(acc50['affinity:dense'])}, "
        f"random {mean_sd(acc50['random'])}; "
        f"one-way ANOVA over the {len(sets50)} sets' orders p = {p_text(anova)}; {test_size(k50, records)}",
        "—",
        cite(records, "[prompt order](docs/research/prompt-order.md"
                      "#the-order-averaged-out-eight-random-orders-per-selection-k--50)",
             "select-order-perm8-k50-rotten_tomatoes.json")])

    def gains(search: dict, k: int) -> str:
        g = search_gains(search)
        lost = ", ".join(f"{METHODS[m]} seed {s} {100 * d:+.1f}" for m, s, d in g if d < 0)
        return (f"{100 * statistics.fmean(d for *_, d in g):+.1f} at k = {k} ({sum(d > 0 for *_, d in g)} of {len(g)} "
                f"sets better, paired t-test p = {p_text(paired_p([d for *_, d in g]))}; lost: {lost or 'none'})")

    s50 = records("order-search-k50-rotten_tomatoes.json")
    rows.append([
        "`--order search` gain over the order averaged out", "`python research/order_search.py ...`",
        "CPU, 2 threads",
        f"on average {gains(s20, 20)}; {gains(s50, 50)}; the chosen order of {s20['candidates']} on "
        f"{s20['queries']} validation queries against the mean of the random ones",
        "—",
        cite(records, "[prompt order](docs/research/prompt-order.md"
                      "#choosing-the-order-on-the-validation-queries---order-search-k--50)",
             "order-search-k20-rotten_tomatoes.json", "order-search-k50-rotten_tomatoes.json")])

    ev = records("order-evaluators-k20-rotten_tomatoes.json")
    rows.append([
        "which evaluator chooses the order: the compressed caches against the dense prompt, k = 20",
        "`python research/order_evaluators.py docs/results/order-search-k20-rotten_tomatoes.json OUT --compressor G "
        "--control C --pool-size 100`", "CPU, 2 threads", order_evaluators(ev),
        "—",
        cite(records, "[prompt order](docs/research/prompt-order.md#which-evaluator-should-choose-the-order)",
             "order-evaluators-k20-rotten_tomatoes.json")])

    rows.append([
        "`cr`, k = 20, orders averaged (3 seeds)", "`bench select-quality --tasks cr ...`", "CPU, 1 thread",
        f"{against_baselines(orders_averaged(cr, 'sq'))}; {test_size(cr, records)}",
        "—",
        cite(records, "[label balance](docs/research/label-balance.md)", "select-order-perm4-k20-cr.json")])

    head = records("headroom-k20.json")
    edge = records("headroom-k20-edge_existence-10sets.json")
    mmlu = records("headroom-k20-mmlu.json")
    tasks = {**head["tasks"], **edge["tasks"], **mmlu["tasks"]}
    name = lambda t: "Rotten Tomatoes" if t == "rotten_tomatoes" else f"`{t}`"  # noqa: E731
    rows.append([
        f"what there is to select: best of {head['tasks']['rotten_tomatoes']['sets']} random {head['k']}-sets over the "
        "mean set",
        "`icl-ssm bench headroom --tasks rotten_tomatoes cr coin_flip modular_addition --k 20 --sets 30 "
        "--test-size 200`",
        "CPU, 1 thread",
        ", ".join(f"{name(t)} {100 * v['best_minus_mean']:+.1f}" for t, v in tasks.items())
        + f"; {head['tasks']['rotten_tomatoes']['sets']} sets x {head['test_size']} test examples "
        f"(`edge_existence` {edge['tasks']['edge_existence']['sets']} x {edge['test_size']}; `mmlu` "
        f"{mmlu['tasks']['mmlu']['sets']} x {mmlu['tasks']['mmlu']['queries']}, the asset's test questions, 2 threads)",
        "—",
        cite(records, "[headroom](docs/research/headroom.md)", "headroom-k20.json",
             "headroom-k20-edge_existence-10sets.json", "headroom-k20-mmlu.json")])

    q32 = records("select-k50-q32-balanced-rotten_tomatoes.json")
    q96 = records("select-k50-q96-balanced-rotten_tomatoes.json")
    split32 = {a["seed"]: a["dense_split_half"] for a in q32["agreement"]}
    (split96,) = [a["dense_split_half"] for a in q96["agreement"]]
    n32, n96 = q32["settings"]["queries"], q96["settings"]["queries"]
    rows.append([
        "dense ranking's reliability (k = 50, split-half)",
        "`bench select-quality --queries 96 ...`, `python research/reliability.py`", "CPU, 2 threads",
        f"{min(split32.values()):.2f}-{max(split32.values()):.2f} at {n32} queries ({len(split32)} seeds); "
        f"{split96:.2f} at {n96} (1 seed), Spearman-Brown from seed 0's {split32[0]:.2f} at {n32} predicts "
        f"{spearman_brown(split32[0], n96 / n32):.2f}; {q32['settings']['subsets']} subsets a seed",
        "—",
        cite(records, "[k = 50](docs/research/selection-k50.md)", "select-k50-q32-balanced-rotten_tomatoes.json",
             "select-k50-q96-balanced-rotten_tomatoes.json")])

    cells = {}
    for name in ("estimators-k8-dense-rotten_tomatoes.json", "estimators-k8-dense-per-label-rotten_tomatoes.json"):
        for r in records(name)["rows"]:
            if r["estimator"] in ("mean", "ridge"):
                cells[r["seed"], r["subsets"], r["estimator"]] = r["test_accuracy"]
    pairs = sorted({(s, m) for s, m, _ in cells})
    diffs = [cells[s, m, "ridge"] - cells[s, m, "mean"] for s, m in pairs]
    rows.append([
        "estimators: ridge vs the paper's mean (dense evaluator, k = 8)",
        "`icl-ssm bench estimators --evaluator dense --k 8 --budgets 30 60 120 --permutations 4`", "CPU, 2 threads",
        f"level: paired {100 * statistics.fmean(diffs):+.1f} points ({len({s for s, _ in pairs})} seeds x "
        f"{len({m for _, m in pairs})} budgets, ridge minus mean)",
        "at most half the subsets",
        cite(records, "[estimators](docs/research/estimators.md)", "estimators-k8-dense-rotten_tomatoes.json",
             "estimators-k8-dense-per-label-rotten_tomatoes.json")])
    return table(BENCH, rows)


def select_cost(records: Records) -> str:
    """BENCHMARKS' 'Selection cost': FLOPs per scored subset, attention counted, the shipped k = 20
    compressor read at every k; in brackets the same ratios before attention was counted."""
    attn, before = records("select-cost-attention.json"), records("select-cost-packed.json")
    a = {(r["k"], r["evaluator"]): r["flops_vs_compressed"] for r in attn["rows"]}
    b = {(r["k"], r["evaluator"]): r["flops_vs_compressed"] for r in before["rows"]}
    command = (f"`icl-ssm bench select-cost --compressor DIR --k 20 50 200 --queries {attn['queries']} "
               f"--subsets {attn['subsets']} --per-query-max-k 50`")
    links = cite(records, "[cost](docs/research/selection-cost.md)", "select-cost-attention.json",
                 "select-cost-packed.json")
    machine = "CPU, 2 threads"
    rows = [[
        "k = 50: compressed (the 36-slot k = 20 compressor) vs dense per query (the paper's accounting)", command,
        machine, f"{a[50, 'dense-per-query']:.1f}x fewer, attention counted", ">= 14x",
        cite(records, "[cost](docs/research/selection-cost.md)", "select-cost-attention.json")]]
    for k, measure, goal in ((50, "k = 50: compressed (36 slots) vs dense prefix shared by the queries", ">= 2x"),
                             (200, "k = 200: compressed (36 slots) vs dense prefix shared", ">= 8x")):
        rows.append([
            measure, "same", machine,
            f"{a[k, 'dense']:.1f}x fewer batched; {a[k, 'dense-packed']:.1f}x with both packed, attention counted "
            f"({b[k, 'dense']:.1f}x / {b[k, 'dense-packed']:.1f}x without it)", goal, links])
    rows.append([
        "k = 20: compressed vs dense prefix shared; vs per query", "same", machine,
        f"{a[20, 'dense']:.1f}x ({a[20, 'dense-packed']:.1f}x packed); {a[20, 'dense-per-query']:.1f}x, attention "
        f"counted ({b[20, 'dense']:.1f}x / {b[20, 'dense-packed']:.1f}x prefix shared without it)", "—", links])
    g128 = records("ssm-input-rotten_tomatoes-k50-96x64.json")
    return (table(BENCH, rows)
            + f"\n\nThe shipped k = 50 compressor (G128, {g128['cache_tokens']} slots) was not measured here: its "
            f"fidelity run at {g128['queries']} queries counted "
            f"{g128['flops_compressed'] / 1e9:,.0f} against {g128['flops_dense'] / 1e9:,.0f} dense GFLOP per subset, "
            f"{g128['flops_dense'] / g128['flops_compressed']:.1f}x fewer, attention counted "
            f"({records.link('ssm-input-rotten_tomatoes-k50-96x64.json')}).")


def order_evaluators(ev: dict) -> str:
    """The ``research/order_evaluators.py`` summary: each evaluator's chosen order on test, paired with the dense
    choice, and its agreement with the dense ranking of the orders."""
    rows, sm = ev["rows"], ev["summary"]
    parts = [f"the order each chooses of {len(rows[0]['test_accuracy'])} on {ev['queries']} validation queries, "
             f"over the mean random order: dense {100 * sm['dense']['minus_mean_random_order']:+.1f}"]
    for name, label in (("compressed", "compressed (G)"), ("control", "control")):
        diff = [r["test_accuracy"][r["chosen"][name]] - r["test_accuracy"][r["chosen"]["dense"]] for r in rows]
        parts.append(f"{label} {100 * sm[name]['minus_mean_random_order']:+.1f} ({100 * statistics.fmean(diff):+.1f} "
                     f"against the dense choice: {sum(d > 1e-9 for d in diff)} sets better, "
                     f"{sum(d < -1e-9 for d in diff)} worse; the dense choice in {sm[name]['same_choice_as_dense']} "
                     f"of {sm['sets']}; mean Spearman with the dense losses over the orders "
                     f"{sm[name]['mean_spearman_with_dense']:.2f})")
    return "; ".join(parts) + (f"; {sm['sets']} sets (the 5 methods x 3 seeds of the order-search record), test "
                               "accuracy on 150 examples, one order each")
