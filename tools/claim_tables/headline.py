"""docs/results.md's 'In one table': one row per headline claim, each from the records behind it.

Reads, through the one adapter, the records the BENCHMARKS tables it sums up read: the cost
(``select-cost-attention.json``, :mod:`.readers.selection`), the ranking fidelity at k = 20 and 50
(:mod:`.readers.fidelity`), selection quality (``bench select-order``), the prompt search at equal time (joined by
:func:`~.readers.trust_targets.equal_time`), the pre-registered trust runs and their evaluation
(:func:`~.readers.trust_search.evaluation`), the equal-time calibration experiment and the synthetic regression.
Each row is one record joined from those it reads (:func:`~.readers.common.combined`, with the statistics it
states over them: the mean and sd over training seeds), rendered by the one renderer (:func:`.rows.render_rows`).
"""

from __future__ import annotations

from icl_ssm.records import Metric, Record

from .adapt import read
from .base import RESULTS, Records, pct
from .readers.common import combined
from .render import FORMATS, metric_text
from .rows import Row, est, render_rows, val
from .selection import METHODS
from .trust import EQUAL_TIME, PLANNED_RUNS, SCREEN_NAMES, equal_time_record, named, read_trust_runs, worse_of

TASK_NAMES = {"rotten_tomatoes": "Rotten Tomatoes"}
HEADERS = ["measure", "icl-ssm", "beside it", "rests on"]
CALIBRATE = "calibration/calibrate-equal-time.json"
SEEDS = {"G": ["g0.compressed.spearman", "g12.compressed.spearman", "g12.G-s2.spearman"],
         "control": ["g0.control.spearman", "g12.control.spearman", "g12.control-s2.spearman"]}


def _points(metric: Metric) -> str:
    """A difference in points with its interval: ``-0.8 [-5.2, +3.8]``."""
    return metric_text(metric, FORMATS["points"])


def _row(name: str, sources: dict[str, Record], cells: dict, stats: dict | None = None, **config) -> Row:
    """One row: ``sources`` joined (:func:`combined`, with ``stats`` over them and ``config``), ``name`` its
    measure, ``cells`` its other columns."""
    return Row(combined(name, sources, stats, {"measure": name, **config}), cells)


def _size(r: Record, alias: str) -> str:
    """``96 x 64``: the held-out subsets and queries of source ``alias``."""
    config = r.config["sources"][alias]
    return f"{config['subsets']} x {config['queries']}"


def cost_and_ranking(records: Records, depth: int) -> list[Row]:
    """The cost of scoring a subset at k = 50 and the subset ranking at k = 20 and 50."""
    link = lambda name: records.link(name, depth)  # noqa: E731
    ratio = lambda r, path: f"{r[f'cost.k50.{path}.flops_ratio'].value:.1f}x"  # noqa: E731
    cost = _row("cost of scoring a subset, k = 50", {"cost": read(records, "select-cost-attention.json")}, {
        "icl-ssm": lambda r: (f"{ratio(r, 'dense')} fewer FLOPs than a dense prefix shared by the queries "
                              f"({ratio(r, 'dense-packed')}, both packed)"),
        "beside it": lambda r: f"dense per query: {ratio(r, 'dense-per-query')} more",
        "rests on": lambda r: (f"FLOPs counted (attention included), {r.config['sources']['cost']['queries']} "
                               "queries, the shipped k = 20 compressor (36 slots) read at k = 50; counts do not vary "
                               "between runs; " + link("select-cost-attention.json"))})
    k20 = {"g0": "ssm-input-rotten_tomatoes-k20.json", "g12": "seeds-rotten_tomatoes-k20.json"}
    stats = {f"{p}_{s}": (s, keys) for p, keys in SEEDS.items() for s in ("mean", "sd")}
    ranking20 = _row("subset ranking vs dense (Spearman), k = 20, 36 slots",
                     {a: read(records, n) for a, n in k20.items()}, {
        "icl-ssm": lambda r: (f"{val(r['G_mean'])} ± {val(r['G_sd'])} (3 training seeds; shipped: "
                              f"{est(r['g0.compressed.spearman'])})"),
        "beside it": lambda r: (f"prompt-independent control {val(r['control_mean'])} ± {val(r['control_sd'])}; "
                                f"window {val(r['g0.window.spearman'])}"),
        "rests on": lambda r: (f"{r.config['sources']['g0']['subsets']} held-out subsets x "
                               f"{r.config['sources']['g0']['queries']} queries; interval resamples subsets; ± sample "
                               f"sd over training seeds; {link(k20['g0'])}, {link(k20['g12'])}")}, stats)
    k50 = {"big": "ssm-input-rotten_tomatoes-k50-96x64.json", "s0": "k50-recent128-rotten_tomatoes.json",
           "s1": "k50-recent128-seed1-rotten_tomatoes.json"}
    rho = lambda r, key: val(r[f"{key}.spearman"])  # noqa: E731
    ranking50 = _row("subset ranking vs dense (Spearman), k = 50, 148 slots",
                     {a: read(records, n) for a, n in k50.items()}, {
        "icl-ssm": lambda r: (f"shipped: {est(r['big.compressed.spearman'])} on {_size(r, 'big')}; "
                              f"{rho(r, 's0.compressed')} and {rho(r, 's1.compressed')} (2 training seeds) on "
                              f"{_size(r, 's0')}"),
        "beside it": lambda r: (f"control {rho(r, 'big.control')}, window {rho(r, 'big.window')} ({_size(r, 'big')}); "
                                f"control {rho(r, 's0.control')}, {rho(r, 's1.control')}, window "
                                f"{rho(r, 's0.window')} ({_size(r, 's0')})"),
        "rests on": lambda r: ("held-out subsets x queries; interval resamples subsets; "
                               + ", ".join(link(n) for n in k50.values()))})
    return [cost, ranking20, ranking50]


def selection_rows(records: Records, depth: int) -> list[Row]:
    """Selection quality at k = 20 and 50: each method's test accuracy, orders averaged, mean ± sd over seeds."""
    def part(name: str) -> Record:
        record = read(records, name)
        (report,) = record.config["sets"]
        return record.part(report)

    def listed(r: Record, methods: list[tuple[str, str]]) -> str:
        return "; ".join(f"{label} {pct(r[f'{m}.averaged'].value)} ± {pct(r[f'{m}.averaged_sd'].value)}"
                         for m, label in methods if f"{m}.averaged" in r.metrics)

    def row(measure: str, name: str, extra: dict[str, Record] | None = None) -> Row:
        def rests_on(r: Record) -> str:
            c = r.config["sources"]["o"]
            return (f"{c['test_examples']} test examples x {len(c['seeds'])} seeds x {c['permutations']} orders "
                    f"(accuracy averaged over the orders, then mean ± sample sd over seeds); "
                    f"{records.link(name, depth)}")
        ours = [(f"o.{m}", METHODS[m]) for m in ("affinity", "affinity:dense")]
        beside = [(f"o.{m}", METHODS[m]) for m in ("random", "topk", "bm25")]
        beside += [("b.bridge:dense", METHODS["bridge"])] if extra else []  # BRIDGE with the dense evaluator
        return _row(measure, {"o": part(name), **(extra or {})}, {
            "icl-ssm": lambda r: listed(r, ours), "beside it": lambda r: listed(r, beside), "rests on": rests_on})

    return [row("selection, k = 20, pool 100 (test accuracy, %)", "select-order-perm8-k20-rotten_tomatoes.json",
                {"b": part("select-order-k20-bridge-gradce.json")}),
            row("selection, k = 20, `--per-label` (test accuracy, %)",
                "select-order-perm8-k20-per-label-rotten_tomatoes.json"),
            row("selection, k = 50, pool 200 (test accuracy, %)", "select-order-perm8-k50-rotten_tomatoes.json")]


def equal_time_row(records: Records, depth: int) -> Row:
    """The prompt search at equal time: a screen before the dense confirmation minus no screen, per budget."""
    def c(r: Record) -> dict:
        return r.config["sources"]["e"]

    def screens(r: Record) -> str:
        return "; ".join(f"{m} min: compressed {_points(r[f'e.{m}.compressed.vs_none'])}, control "
                         f"{_points(r[f'e.{m}.control.vs_none'])}" for m in c(r)["minutes"])

    def no_screen(r: Record) -> str:
        decision = c(r)["default_screen"]
        return ("no screen: " + "; ".join(f"{m} min " + ", ".join(
            f"{TASK_NAMES.get(t, t)} {pct(r[f'e.{t}.{m}.none.mean'].value)}" for t in c(r)["tasks"])
            for m in c(r)["minutes"])
            + f" test accuracy; the pre-registered rule gives {SCREEN_NAMES.get(decision, decision)}")

    def rests_on(r: Record) -> str:
        tasks, minutes = c(r)["tasks"], c(r)["minutes"]
        return (f"{' and '.join(TASK_NAMES.get(t, t) for t in tasks)}, "
                f"{len(c(r)['seeds'])} seeds each at {' and '.join(minutes)} min, "
                f"{c(r)['test_size']} test examples; interval resamples (task, seed) runs and examples; "
                + ", ".join(records.link(n, depth) for n in [EQUAL_TIME, *c(r)["records"]]))

    return _row("prompt search at equal time: a screen before the dense confirmation, minus no screen (points)",
                {"e": equal_time_record(records)}, {"icl-ssm": screens, "beside it": no_screen, "rests on": rests_on})


def trust_row(records: Records, depth: int) -> Row | None:
    """The pre-registered trust runs: where the handed-over prompt stands on unseen seeds (None without a run)."""
    runs, e = read_trust_runs(records)
    if e is None:
        return None

    def placed(r: Record) -> str:
        v = lambda key: r[f"e.{key}"].value  # noqa: E731
        return (f"at or above 12 of its 16 plain random prompts in {v('at_or_above_three_quarters')} of {v('runs')} "
                f"runs (at or above 8 of them in {v('at_or_above_median')}); at or above the best retrieval prompt "
                f"in {v('at_or_above_retrieval')}; shown better than the median random prompt in "
                f"{v('shown_better_rt_cr')} of the {v('runs_rt_cr')} Rotten Tomatoes and cr runs; shown worse than "
                f"it in {v('shown_worse')}{named(worse_of(e))}")

    def rests_on(r: Record) -> str:
        n = r["e.runs"].value
        return ((f"{n} of {PLANNED_RUNS} runs finished" if n < PLANNED_RUNS else f"{n} runs")
                + f" ({', '.join(r.config['tasks'])}); 400 test examples each; "
                f"[records]({'../' * depth}{RESULTS}/trust-search/)")

    beside = "16 plain random prompts, bm25, topk and per-query bm25 per run, on the same test examples"
    return _row("`run`'s handed-over prompt on unseen seeds (pre-registered: seeds 5-9, 3 tasks)", {"e": e},
                {"icl-ssm": placed, "beside it": lambda r: beside, "rests on": rests_on},
                tasks=sorted({r.config["task"] for r in runs}))


def calibration_row(records: Records, depth: int) -> Row:
    """The pre-registered equal-time experiment of calibration and selection, as one row."""
    def arm(r: Record, name: str) -> str:
        m = lambda key: r[f"c.{name}.{key}"]  # noqa: E731
        vs = "" if m("vs_best").value is None else f", {_points(m('vs_best'))} vs best"
        return (f"{name} {pct(m('accuracy').value)} (raw {pct(m('raw').value)}; {m('wall_mean').value:.0f} s"
                f"{vs})")

    def chosen(r: Record) -> str:
        d = r.config["sources"]["c"]["decision"]
        return (f"{arm(r, d['best'])}; run's default by the rule: {d['default']}"
                + ("" if d["default"] == d["best"] else f" ({arm(r, d['default'])})"))

    def others(r: Record) -> str:
        searches = [n for n in r.config["sources"]["c"]["parts"] if n.startswith("raw-search")]
        return "; ".join(arm(r, n) for n in searches) + f"; {arm(r, 'calibrated-zero-shot')}"

    def rests_on(r: Record) -> str:
        cfg = r.config["sources"]["c"]
        return (f"{', '.join(cfg['tasks'])}, seeds {', '.join(map(str, cfg['seeds']))}, {cfg['test_size']} test "
                "examples; interval resamples (task, seed) runs and test examples; " + records.link(CALIBRATE, depth))

    return _row("calibrate, then select: test accuracy at each arm's own cost (pre-registered; %)",
                {"c": read(records, CALIBRATE)}, {"icl-ssm": chosen, "beside it": others, "rests on": rests_on})


def synthetic_row(records: Records, depth: int) -> Row:
    """The synthetic regression at k = 20: the products cache's ranking and the selection's test MSE."""
    names = {"s": "synthetic-products-select-k20.json", "q64": "synthetic-products-fidelity-q64.json",
             "q16": "synthetic-products-fidelity-q16.json"}
    mse = lambda r, m: f"{r[f's.k20.{m}.mse'].value:.3f}"  # noqa: E731
    rho = lambda r, key: val(r[f"{key}.spearman"])  # noqa: E731
    q = lambda r, alias: r.config["sources"][alias]["queries"]  # noqa: E731
    return _row("synthetic regression, k = 20: SSM on products of neighbouring tokens (`--pair-size`)",
                {a: read(records, n) for a, n in names.items()}, {
        "icl-ssm": lambda r: (f"subset ranking {rho(r, 'q64.compressed')} at {q(r, 'q64')} queries "
                              f"({rho(r, 'q16.compressed')} at {q(r, 'q16')}); selection test MSE "
                              f"{mse(r, 'affinity-compressed')} (dense evaluator {mse(r, 'affinity-dense')})"),
        "beside it": lambda r: (f"control {rho(r, 'q64.control')}, window {rho(r, 'q64.window')}; random prompt "
                                f"{mse(r, 'random')}, topk {mse(r, 'topk')}"),
        "rests on": lambda r: (f"{r.config['sources']['q64']['subsets']} subsets; MSE mean over "
                               f"{r['s.k20.random.mse'].n} seeds; "
                               + ", ".join(records.link(n, depth) for n in names.values()))})


def headline_results(records: Records, depth: int = 1) -> str:
    """docs/results.md's 'In one table'; ``depth``: the page's folders below the root (its record links)."""
    rows = [*cost_and_ranking(records, depth), *selection_rows(records, depth), equal_time_row(records, depth)]
    trust = trust_row(records, depth)
    rows += [trust] if trust else []
    if (records.root / RESULTS / CALIBRATE).is_file():
        rows.append(calibration_row(records, depth))
    rows.append(synthetic_row(records, depth))
    return render_rows(rows, HEADERS)
