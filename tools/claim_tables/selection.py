"""BENCHMARKS' 'Selection quality' and 'Selection cost': one row per measure, each row a record read through the one
adapter (``readers/selection.py``: ``bench select-order``, the order searches, the headroom, reliability and
estimator records, ``bench select-cost``) or derived there from several, rendered by the one renderer.
:data:`METHODS` names each method as printed; the summary columns are :func:`bench_columns`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from icl_ssm.records import Record

from .adapt import as_record, read
from .base import Records, cite, p_text, pct
from .readers.common import combined
from .readers.selection import paired_sets, pooled_estimators, reliability_growth
from .render import Column, render

__all__ = ["METHODS", "BASELINES", "bench_row", "bench_columns", "selection_quality", "select_cost"]

METHODS = {"affinity": "affinity", "affinity:dense": "dense evaluator", "affinity:rank10": "G-rank10",
           "affinity:si64rank10": "SI64-rank10", "random": "random", "bm25": "bm25", "topk": "topk",
           "bridge": "BRIDGE", "zero-shot": "zero-shot"}
BASELINES = ("random", "bm25", "topk")
MACHINE = "CPU, 2 threads"
ORDER_PAGE = "[prompt order](docs/research/prompt-order.md"
K20_PAGE = ORDER_PAGE + "#k--20-at-the-demos-scale-the-order-averaged-out-and-searched-3-seeds)"
LABEL_PAGE = "[label balance](docs/research/label-balance.md)"


def bench_row(record: Record, row: str, /, **text: Any) -> Record:
    """``record`` as one row of a summary table: ``text`` (``measure``, ``command``, ``machine``, ``goal``,
    ``record`` and what its cell reads) joins its config; ``row`` names its measured cell (:func:`bench_columns`)."""
    return replace(record, config={**record.config, **text, "row": row})


def bench_columns(cells: dict[str, Callable[[Record], str]]) -> list[Column]:
    """The summary tables' columns (``base.BENCH``); the measured cell is ``cells[row]`` of the row's ``row``."""
    return [Column("measure", config="measure"), Column("command", config="command"),
            Column("machine", config="machine"), Column("measured", cell=lambda r: cells[r.config["row"]](r)),
            Column("goal", config="goal"), Column("record", config="record")]


def mean_sd(r: Record, key: str) -> str:
    """``65.2 ± 1.9``: the mean over seeds and its sd, in %."""
    return f"{100 * r[key].value:.1f} ± {100 * r[f'{key}_sd'].value:.1f}"


def against_baselines(r: Record, what: str) -> str:
    """The selection target's comparison: both affinity evaluators, random, and the best baseline."""
    best = max(BASELINES, key=lambda m: r[f"{m}.{what}"].value)
    return (f"affinity {mean_sd(r, 'affinity.' + what)}, dense evaluator {mean_sd(r, 'affinity:dense.' + what)}; "
            f"random {mean_sd(r, 'random.' + what)}, best baseline {METHODS[best]} {mean_sd(r, f'{best}.{what}')}")


def orders_text(r: Record) -> str:
    c = r.config
    return f"{c['test_examples']} test examples x {len(c['seeds'])} seeds x {c['permutations']} orders"


def ranked(r: Record, what: str) -> list[str]:
    """``method mean ± sd`` for each method of the report, highest mean first."""
    methods = [m for m in r.config["methods"][r.config["part"]] if f"{m}.{what}" in r.metrics]
    return [f"{METHODS[m]} {mean_sd(r, f'{m}.{what}')}" for m in sorted(methods, key=lambda m: -r[f"{m}.{what}"].value)]


def per_label(r: Record) -> str:
    first, *rest = ranked(r, "averaged")
    top, *others = ranked(r, "interleave")
    return (f"orders averaged: {first} leads; {', '.join(rest)}. One order (`interleave`), where "
            f"{top.rsplit(' ', 3)[0]} leads: {top}, {', '.join(others)}; {orders_text(r)}")


def paired_gain(r: Record, label: str) -> str:
    """``+3.8 (paired t-test p = 0.06: not shown beyond chance)``: the mean difference in points, its test."""
    p = r[f"{label}.minus_p"].value
    return (f"{100 * r[f'{label}.minus'].value:+.1f} (paired t-test p = {p_text(p)}"
            f"{': not shown beyond chance' if p >= 0.05 else ''})")


def per_label_vs_plain(r: Record) -> str:
    rt, cr = r.config["sources"]["rt"], r.config["sources"]["cr"]
    by_seed = ", ".join(f"{100 * r[f'rt.seed{s}.minus'].value:+.1f}" for s in rt["seeds"])
    return (f"Rotten Tomatoes {paired_gain(r, 'rt')}; by seed {by_seed}; `cr` {paired_gain(r, 'cr')}; each set's mean "
            f"over {rt['permutations']} random orders (`cr`: {cr['permutations']}), "
            "150 test examples")


def k50(r: Record) -> str:
    return (f"every method {pct(r['averaged_low'].value)}-{pct(r['averaged_high'].value)}: affinity (36-slot "
            f"compressor) {mean_sd(r, 'affinity.averaged')}, dense evaluator {mean_sd(r, 'affinity:dense.averaged')}, "
            f"random {mean_sd(r, 'random.averaged')}; one-way ANOVA over the {r['sets'].value} sets' orders "
            f"p = {p_text(r['anova_p'].value)}; {orders_text(r)}")


def gains(r: Record, label: str, k: int) -> str:
    lost = ", ".join(f"{METHODS[m]} seed {s} {100 * g:+.1f}" for m, s in r.config["sources"][label]["sets"]
                     if (g := r[f"{label}.{m}.seed{s}.gain"].value) < 0)
    return (f"{100 * r[f'{label}.gain'].value:+.1f} at k = {k} ({r[f'{label}.sets_better'].value} of "
            f"{r[f'{label}.gain'].n} sets better, paired t-test p = {p_text(r[f'{label}.gain_p'].value)}; "
            f"lost: {lost or 'none'})")


def search_gain(r: Record) -> str:
    k20 = r.config["sources"]["k20"]
    return (f"on average {gains(r, 'k20', 20)}; {gains(r, 'k50', 50)}; the chosen order of "
            f"{k20['candidates']} on {k20['queries']} validation queries against the mean "
            "of the random ones")


def evaluators(r: Record) -> str:
    """Each evaluator's chosen order on test, paired with the dense choice, and its agreement with the dense
    ranking of the orders."""
    sets = r.config["sets"]
    parts = [f"the order each chooses of {r.config['candidates']} on {r.config['queries']} validation queries, "
             f"over the mean random order: dense {100 * r['dense.minus_mean_random'].value:+.1f}"]
    for name, label in (("compressed", "compressed (G)"), ("control", "control")):
        parts.append(f"{label} {100 * r[f'{name}.minus_mean_random'].value:+.1f} "
                     f"({100 * r[f'{name}.minus_dense'].value:+.1f} against the dense choice: "
                     f"{r[f'{name}.better_than_dense'].value} sets better, {r[f'{name}.worse_than_dense'].value} "
                     f"worse; the dense choice in {r[f'{name}.same_choice_as_dense'].value} of {sets}; mean Spearman "
                     f"with the dense losses over the orders {r[f'{name}.spearman_with_dense'].value:.2f})")
    return "; ".join(parts) + (f"; {sets} sets (the 5 methods x 3 seeds of the order-search record), test "
                               "accuracy on 150 examples, one order each")


def headroom(r: Record) -> str:
    name = lambda t: "Rotten Tomatoes" if t == "rotten_tomatoes" else f"`{t}`"  # noqa: E731
    best = ", ".join(f"{name(t)} {100 * r[f'{label}.{t}.best_minus_mean'].value:+.1f}"
                     for label in ("head", "edge", "mmlu") for t in r.config["sources"][label]["tasks"])
    v = {k: r[k].value for k in ("head.rotten_tomatoes.sets", "head.rotten_tomatoes.test_size",
                                 "edge.edge_existence.sets", "edge.edge_existence.test_size", "mmlu.mmlu.sets",
                                 "mmlu.mmlu.queries")}
    return (f"{best}; {v['head.rotten_tomatoes.sets']} sets x {v['head.rotten_tomatoes.test_size']} test examples "
            f"(`edge_existence` {v['edge.edge_existence.sets']} x {v['edge.edge_existence.test_size']}; `mmlu` "
            f"{v['mmlu.mmlu.sets']} x {v['mmlu.mmlu.queries']}, the asset's test questions, 2 threads)")


def reliability(r: Record) -> str:
    few, more = r.config["sources"]["fewer"], r.config["sources"]["more"]
    (seed96,) = more["split_half_seeds"]
    return (f"{r['fewer.dense_split_half_low'].value:.2f}-{r['fewer.dense_split_half_high'].value:.2f} at "
            f"{few['queries']} queries ({len(few['split_half_seeds'])} seeds); "
            f"{r[f'more.seed{seed96}.dense_split_half'].value:.2f} at {more['queries']} (1 seed), Spearman-Brown from "
            f"seed 0's {r['fewer.seed0.dense_split_half'].value:.2f} at {few['queries']} predicts "
            f"{r['predicted'].value:.2f}; {few['subsets']} subsets a seed")


def estimators(r: Record) -> str:
    return (f"level: paired {100 * r['ridge_minus_mean'].value:+.1f} points ({len(r.config['seeds'])} seeds x "
            f"{len(r.config['budgets'])} budgets, ridge minus mean)")


QUALITY = {"orders averaged": lambda r: f"{against_baselines(r, 'averaged')}; {orders_text(r)}",
           "searched": lambda r: (f"one order per set, chosen of {r.config['candidates']} on {r.config['queries']} "
                                  f"validation queries: {against_baselines(r, 'searched')}; "
                                  f"{len(r.config['sets'])} sets, 3 seeds"),
           "per-label": per_label, "per-label vs plain": per_label_vs_plain, "k50": k50, "search gain": search_gain,
           "evaluators": evaluators, "headroom": headroom, "reliability": reliability, "estimators": estimators}

K20, K20_LABEL = "select-order-perm8-k20-rotten_tomatoes.json", "select-order-perm8-k20-per-label-rotten_tomatoes.json"
K50, CR = "select-order-perm8-k50-rotten_tomatoes.json", "select-order-perm4-k20-cr.json"
S20, S50 = "order-search-k20-rotten_tomatoes.json", "order-search-k50-rotten_tomatoes.json"
EVALUATORS = "order-evaluators-k20-rotten_tomatoes.json"
HEADROOM = {"head": "headroom-k20.json", "edge": "headroom-k20-edge_existence-10sets.json",
            "mmlu": "headroom-k20-mmlu.json"}
Q32, Q96 = "select-k50-q32-balanced-rotten_tomatoes.json", "select-k50-q96-balanced-rotten_tomatoes.json"
ESTIMATORS = ("estimators-k8-dense-rotten_tomatoes.json", "estimators-k8-dense-per-label-rotten_tomatoes.json")


def order_rows(records: Records) -> list[Record]:
    """The rows on the prompt order and label balance: the sets in random orders, searched, per label."""
    k20, balanced, cr = read(records, K20), read(records, K20_LABEL), read(records, CR)
    s20, s50 = read(records, S20), read(records, S50)
    pairs = combined("per-label vs plain", {"rt": paired_sets(k20.part("sq"), balanced.part("sq")),
                                            "cr": paired_sets(cr.part("sq"), cr.part("sq-pl"))})
    rt = pairs.config["sources"]["rt"]
    k50 = read(records, K50)
    (k50_report,) = k50.config["sets"]
    quality = ("`bench select-quality ... --per-label`, then `bench select-order --permutations 8`")
    return [
        bench_row(k20.part("sq"), "orders averaged", measure="k = 20, pool 100, orders averaged (3 seeds)",
                  command="`icl-ssm bench select-quality --compressor G --k 20 --seeds 0 1 2 --pool-size 100 "
                  "--queries 8 --subsets 20 --test-size 150`, then `bench select-order --permutations 8`",
                  machine=MACHINE, goal="+5 over best baseline; compressed within 1 of dense",
                  record=cite(records, K20_PAGE, K20)),
        bench_row(s20, "searched", measure="same sets, every method's order searched",
                  command="`python research/order_search.py SQ.json ORDER.json OUT.json --queries 32 --candidates 10`",
                  machine=MACHINE, goal="—", record=cite(records, K20_PAGE, S20)),
        bench_row(balanced.part("sq"), "per-label", measure="k = 20, `--per-label` (3 seeds)", command=quality,
                  machine=MACHINE, goal="—", record=cite(records, LABEL_PAGE, K20_LABEL)),
        bench_row(pairs, "per-label vs plain",
                  measure=f"`--per-label` vs plain, orders averaged, {pairs['rt.minus'].n} sets "
                  f"({len(rt['methods'])} methods x {len(rt['seeds'])} seeds)",
                  command="same", machine="CPU", goal="—", record=cite(records, LABEL_PAGE, K20, K20_LABEL, CR)),
        bench_row(k50.part(k50_report), "k50", measure="k = 50, pool 200, 16 queries, orders averaged (3 seeds)",
                  command="`bench select-quality --k 50 --pool-size 200 --subsets 40 ...`, then "
                  "`bench select-order --permutations 8`", machine=MACHINE, goal="—",
                  record=cite(records, ORDER_PAGE + "#the-order-averaged-out-eight-random-orders-per-selection-k--50)",
                              K50)),
        bench_row(combined("search gain", {"k20": s20, "k50": s50}), "search gain",
                  measure="`--order search` gain over the order averaged out",
                  command="`python research/order_search.py ...`", machine=MACHINE, goal="—",
                  record=cite(records, ORDER_PAGE + "#choosing-the-order-on-the-validation-queries---order-search-"
                              "k--50)", S20, S50)),
        bench_row(read(records, EVALUATORS), "evaluators",
                  measure="which evaluator chooses the order: the compressed caches against the dense prompt, k = 20",
                  command="`python research/order_evaluators.py docs/results/order-search-k20-rotten_tomatoes.json OUT "
                  "--compressor G --control C --pool-size 100`", machine=MACHINE, goal="—",
                  record=cite(records, ORDER_PAGE + "#which-evaluator-should-choose-the-order)", EVALUATORS)),
        bench_row(cr.part("sq"), "orders averaged", measure="`cr`, k = 20, orders averaged (3 seeds)",
                  command="`bench select-quality --tasks cr ...`", machine="CPU, 1 thread", goal="—",
                  record=cite(records, LABEL_PAGE, CR))]


def other_rows(records: Records) -> list[Record]:
    """The rows on what there is to select, how reliably it ranks and which estimator."""
    room = combined("headroom", {label: read(records, name) for label, name in HEADROOM.items()})
    return [
        bench_row(room, "headroom",
                  measure=f"what there is to select: best of {room['head.rotten_tomatoes.sets'].value} random "
                  f"{room.config['sources']['head']['k']}-sets over the mean set",
                  command="`icl-ssm bench headroom --tasks rotten_tomatoes cr coin_flip modular_addition --k 20 "
                  "--sets 30 --test-size 200`", machine="CPU, 1 thread", goal="—",
                  record=cite(records, "[headroom](docs/research/headroom.md)", *HEADROOM.values())),
        bench_row(reliability_growth(read(records, Q32), read(records, Q96)), "reliability",
                  measure="dense ranking's reliability (k = 50, split-half)",
                  command="`bench select-quality --queries 96 ...`, `python research/reliability.py`", machine=MACHINE,
                  goal="—", record=cite(records, "[k = 50](docs/research/selection-k50.md)", Q32, Q96)),
        bench_row(pooled_estimators([read(records, n) for n in ESTIMATORS]), "estimators",
                  measure="estimators: ridge vs the paper's mean (dense evaluator, k = 8)",
                  command="`icl-ssm bench estimators --evaluator dense --k 8 --budgets 30 60 120 --permutations 4`",
                  machine=MACHINE, goal="at most half the subsets",
                  record=cite(records, "[estimators](docs/research/estimators.md)", *ESTIMATORS))]


def selection_quality(records: Records) -> str:
    """BENCHMARKS' 'Selection quality' (the one renderer, over the records read through the one adapter)."""
    return render(order_rows(records) + other_rows(records), bench_columns(QUALITY))


SELECT_COST = ("select-cost-attention.json", "select-cost-packed.json")
G128 = "ssm-input-rotten_tomatoes-k50-96x64.json"


def cost_shared(r: Record) -> str:
    """Compressed vs a dense prefix shared by the queries at the row's ``k``, batched and packed, both accountings."""
    k = r.config["k"]
    ratio = lambda at: f"{r[f'{at}.flops_ratio'].value:.1f}x"  # noqa: E731
    return (f"{ratio(f'attention.k{k}.dense')} fewer batched; {ratio(f'attention.k{k}.dense-packed')} with both "
            f"packed, attention counted ({ratio(f'packed.k{k}.dense')} / {ratio(f'packed.k{k}.dense-packed')} "
            "without it)")


def cost_k20(r: Record) -> str:
    ratio = lambda at: f"{r[f'{at}.flops_ratio'].value:.1f}x"  # noqa: E731
    return (f"{ratio('attention.k20.dense')} ({ratio('attention.k20.dense-packed')} packed); "
            f"{ratio('attention.k20.dense-per-query')}, attention counted ({ratio('packed.k20.dense')} / "
            f"{ratio('packed.k20.dense-packed')} prefix shared without it)")


COST = {"per query": lambda r: f"{r['attention.k50.dense-per-query.flops_ratio'].value:.1f}x fewer, attention counted",
        "shared": cost_shared, "k20": cost_k20}


def select_cost(records: Records) -> str:
    """BENCHMARKS' 'Selection cost': FLOPs per scored subset, attention counted, the shipped k = 20
    compressor read at every k; in brackets the same ratios before attention was counted."""
    both = combined("select cost", {"attention": read(records, SELECT_COST[0]),
                                    "packed": read(records, SELECT_COST[1])})
    attention = both.config["sources"]["attention"]
    links = cite(records, "[cost](docs/research/selection-cost.md)", *SELECT_COST)
    same = {"command": "same", "machine": MACHINE, "record": links}
    rows = [bench_row(both, "per query", measure="k = 50: compressed (the 36-slot k = 20 compressor) vs dense per "
                      "query (the paper's accounting)",
                      command=f"`icl-ssm bench select-cost --compressor DIR --k 20 50 200 --queries "
                      f"{attention['queries']} --subsets {attention['subsets']} --per-query-max-k 50`",
                      machine=MACHINE, goal=">= 14x",
                      record=cite(records, "[cost](docs/research/selection-cost.md)", SELECT_COST[0])),
            bench_row(both, "shared", k=50, measure="k = 50: compressed (36 slots) vs dense prefix shared by the "
                      "queries", goal=">= 2x", **same),
            bench_row(both, "shared", k=200, measure="k = 200: compressed (36 slots) vs dense prefix shared",
                      goal=">= 8x", **same),
            bench_row(both, "k20", measure="k = 20: compressed vs dense prefix shared; vs per query", goal="—",
                      **same)]
    raw = records(G128)
    g128 = as_record(G128, raw)  # the fidelity family's reader; it does not keep the slot count, read as stored
    return (render(rows, bench_columns(COST))
            + f"\n\nThe shipped k = 50 compressor (G128, {raw['cache_tokens']} slots) was not measured here: its "
            f"fidelity run at {g128.config['queries']} queries counted {g128['compressed.gflop'].value:,.0f} against "
            f"{g128['dense.gflop'].value:,.0f} dense GFLOP per subset, {1 / g128['compressed.flops_share'].value:.1f}x "
            f"fewer, attention counted ({records.link(G128)}).")
