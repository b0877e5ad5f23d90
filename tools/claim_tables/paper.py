"""BENCHMARKS' 'The paper's artefacts': each table and figure of the paper, the paper's number and ours.

One row per artefact, each one record joined from the records of its own measurement, read through the one adapter
(:func:`~.readers.common.combined`, with the minima, maxima and differences the row states over them): the
output error (fidelity and ``bench long-context`` records, :mod:`.readers.paper_runs`), the FLOP saving (``bench
select-cost``), the long-context methods at the same cache size, the main selection table with BRIDGE and GradCE
and per-query retrieval, the synthetic case study in one row (:mod:`.readers.synthetic`), the flipped-label probe,
length generalisation (``bench length``), the 4-task transfer matrix
(:func:`~.readers.paper_runs.transfer_matrix`) and n_v (fidelity reports with ``--also`` paths). Rendered by the
one renderer (:func:`.rows.render_rows`).
"""

from __future__ import annotations

from icl_ssm.records import Record

from .adapt import read
from .base import Records, cite, pct
from .readers.common import combined
from .readers.paper_runs import transfer_matrix
from .rows import Row, est, render_rows, val

HEADERS = ["artefact", "command", "paper", "ours (machine)", "record"]
COMPARISONS = "[comparisons](docs/research/paper-comparisons.md"
SYNTHETIC = ("[synthetic](docs/research/synthetic-regression.md), "
             "[products](docs/research/ssm-input.md#products-of-neighbouring-tokens)")
LONG_CONTEXT = ("long-context-rotten_tomatoes-k50-k75.json", "long-context-coin_flip-k50-k75.json")


def _row(artefact: str, command: str, paper: str, record: str, sources: dict[str, Record], ours,
         stats: dict | None = None) -> Row:
    """One artefact: ``sources`` joined (:func:`combined`, with ``stats`` over them), its settings, and
    ``ours(record)``, the text of the 'ours' column."""
    labels = {"artefact": artefact, "command": command, "paper": paper, "record": record}
    return Row(combined(artefact, sources, stats, labels), {"ours (machine)": ours})


def _source(r: Record, alias: str) -> dict:
    return r.config["sources"][alias]


def output_error(records: Records) -> Row:
    """The output error of the compressed cache: relative logit error and KL at k = 20, 50 and 75."""
    names = {"g": "ssm-input-rotten_tomatoes-k20.json", "lc": LONG_CONTEXT[0]}

    def ours(r: Record) -> str:
        return (f"relative logit error {pct(r['g.compressed.rel_logit_err'].value)}% (k = 20), "
                f"{pct(r['lc.compressed.rel_logit_err_min'].value, 0)}-"
                f"{pct(r['lc.compressed.rel_logit_err_max'].value, 0)}% (k = "
                f"{' and '.join(map(str, _source(r, 'lc')['ks']))}); KL {val(r['kl_min'], '.3f')}-"
                f"{val(r['kl_max'], '.3f')} (CPU)")

    return _row("output error of the compressed cache (Algorithm 1)",
                "`icl-ssm fidelity --task rotten_tomatoes --k 20 --compressor G --subsets 30 --queries 32`", "< 0.7%",
                cite(records, "[fidelity targets](docs/research/fidelity-targets.md)", *names.values()),
                {a: read(records, n) for a, n in names.items()}, ours,
                {"kl_min": ("min", ["g.compressed.kl", "lc.compressed.kl_min"]),
                 "kl_max": ("max", ["g.compressed.kl", "lc.compressed.kl_max"])})


def flops(records: Records) -> Row:
    """The FLOPs per evaluated subset, compressed against dense per query and against a shared prefix."""
    names = {"cost": "select-cost-attention.json", "wall": "select-cost-wall-attention.json"}

    def ours(r: Record) -> str:
        return (f"{r['cost.k50.dense-per-query.flops_ratio'].value:.1f}x at k = 50, {_source(r, 'cost')['queries']} "
                "queries, the 36-slot k = 20 compressor read at k = 50, attention counted (against a dense prefix "
                f"shared by {_source(r, 'wall')['queries']} queries, packed: "
                f"{r['wall.50.dense-packed.flops_vs_compressed'].value:.1f}x, attention counted) (CPU)")

    return _row("FLOPs per evaluated subset, compressed vs dense per query",
                "`icl-ssm bench select-cost --compressor DIR --k 20 50 200 --queries 16 --subsets 1 "
                "--per-query-max-k 50`", "14.2x fewer",
                cite(records, "[cost](docs/research/selection-cost.md)", *names.values()),
                {a: read(records, n) for a, n in names.items()}, ours)


def _long_context_text(r: Record) -> str:
    """The long-context comparison at the same cache size: KL, cache memory and FLOPs per path."""
    ks = _source(r, "rt")["ks"]
    per = lambda t, path, key, fmt: " / ".join(fmt(r[f"{t}.k{k}.{path}.{key}"].value) for k in ks)  # noqa: E731
    two, three, share = (lambda x: f"{x:#.2g}"), (lambda x: f"{x:.3f}"), (lambda x: f"{x:.2f}")
    kl = lambda t, path, fmt=two: per(t, path, "kl", fmt)  # noqa: E731
    at = lambda t, key: r[f"{t}.k{ks[0]}.compressed.{key}"].value  # noqa: E731
    overlap = "overlap" if r["overlap"].value == 1 else "do not all overlap"
    return (f"Rotten Tomatoes ({at('rt', 'slots')} slots): KL {kl('rt', 'compressed', three)} "
            f"(k = {' / '.join(map(str, ks))}) against window {kl('rt', 'window')}, StreamingLLM "
            f"{kl('rt', 'streaming')}, "
            f"LM-Infinite {kl('rt', 'lm-infinite')}; `coin_flip` ({at('cf', 'slots')} slots): KL "
            f"{kl('cf', 'compressed', three)} against window {kl('cf', 'window')}, StreamingLLM "
            f"{kl('cf', 'streaming')}, "
            f"LM-Infinite {kl('cf', 'lm-infinite')}, control {kl('cf', 'control', three)}; "
            f"{at('rt', 'cache_mib'):.1f} MiB of cache against {val(r['rt.dense.cache_mib_min'], '.0f')}-"
            f"{val(r['rt.dense.cache_mib_max'], '.0f')} MiB; {per('rt', 'compressed', 'flops_vs_dense', share)} of the "
            f"dense FLOPs on Rotten Tomatoes, {per('cf', 'compressed', 'flops_vs_dense', share)} on `coin_flip`, "
            f"attention counted (the other two: {val(r['others_min'])}-{val(r['others_max'])}, they need the dense "
            f"prefill); ranking Spearman intervals {overlap} at {_source(r, 'rt')['subsets']} subsets (CPU)")


def long_context(records: Records) -> Row:
    """The long-context methods at the same cache size, on Rotten Tomatoes and ``coin_flip``."""
    sources = {"rt": read(records, LONG_CONTEXT[0]), "cf": read(records, LONG_CONTEXT[1])}
    others = [f"{t}.k{k}.{p}.flops_vs_dense" for t in sources for k in sources["rt"].config["ks"]
              for p in ("streaming", "lm-infinite")]
    overlaps = [f"{t}.spearman_intervals_overlap" for t in sources]
    return _row("against long-context methods at the same cache size (error, FLOPs, memory)",
                "`icl-ssm bench long-context --tasks rotten_tomatoes coin_flip --k 50 75 --subsets 12 --queries 8 "
                "--out O` (`coin_flip`: `--compressor coin_flip=DIR`)",
                "the compressor ahead of StreamingLLM, LM-Infinite and the trained systems",
                cite(records, COMPARISONS + "#long-context-methods-at-the-same-cache-size-rotten-tomatoes-and-coin_flip"
                     "-k--50-and-75)", *LONG_CONTEXT) + ", [plot](docs/figures/long-context-rotten_tomatoes.png)",
                sources, lambda r: _long_context_text(r) + ". Trained systems: not built "
                "([paper.md](docs/paper.md#comparison-systems-not-built-here))",
                {"others_min": ("min", others), "others_max": ("max", others), "overlap": ("min", overlaps)})


BASELINES = ("bridge:dense", "topk", "random", "bm25", "gradce")  # the main table's best baseline is one of these


def main_selection(records: Records, order: Record) -> Row:
    """The main selection table, orders averaged: affinity against BRIDGE, GradCE and the baselines."""
    def ours(r: Record) -> str:
        ms = lambda m: f"{pct(r[f'o.{m}.averaged'].value)} ± {pct(r[f'o.{m}.averaged_sd'].value)}"  # noqa: E731
        mean = lambda m: pct(r[f"o.{m}.averaged"].value)  # noqa: E731
        behind = r["behind"].value
        return (f"Rotten Tomatoes, k = 20, {r['o.affinity.averaged'].n} seeds x {_source(r, 'o')['test_examples']} "
                f"test reviews, orders averaged (± sample sd over seeds): affinity {ms('affinity')} (dense "
                f"{ms('affinity:dense')}); BRIDGE {ms('bridge:dense')} (+ Algorithm 1: {ms('bridge')}); top-k "
                f"{mean('topk')}, random {mean('random')}, BM25 {mean('bm25')}, GradCE {ms('gradce')}, zero-shot "
                f"{mean('zero-shot')}: affinity {100 * abs(behind):.1f} {'below' if behind > 0 else 'above'} the "
                "best baseline (CPU)")

    return _row("main selection table (random, BM25, top-k, GradCE, BRIDGE, + Algorithm 1 rows, zero-shot)",
                "`icl-ssm bench select-quality --methods affinity affinity:dense bridge bridge:dense random bm25 topk "
                "gradce ...`, then `bench select-order --permutations 8`", "+6.48 points over the best baseline",
                cite(records, COMPARISONS + "#the-selection-table-with-bridge-gradce-and-a-zero-shot-row-rotten-"
                     "tomatoes-k--20)", order.name),
                {"o": order}, ours, {"best": ("max", [f"o.{m}.averaged" for m in BASELINES]),
                                     "behind": ("minus", ["best", "o.affinity.averaged"])})


def per_query(records: Records, order: Record) -> Row:
    """Per-query retrieval (BM25 and top-k for each test input) beside one set per task."""
    name = "per-query-k20-rotten_tomatoes.json"

    def ours(r: Record) -> str:
        ms = lambda m: f"{pct(r[f'q.{m}.accuracy'].value)} ± {pct(r[f'q.{m}.accuracy_sd'].value)}"  # noqa: E731
        return (f"Rotten Tomatoes, k = 20, {r['q.bm25.accuracy'].n} seeds: BM25 {ms('bm25')}, top-k {ms('topk')} "
                f"(one set per task: {pct(r['o.bm25.averaged'].value)} and {pct(r['o.topk.averaged'].value)} orders "
                f"averaged); {r['q.answer_flops_min'].value / 1e12:.0f}-{r['q.answer_flops_max'].value / 1e12:.0f} "
                f"TFLOP and {val(r['q.answer_seconds_min'], '.0f')}-{val(r['q.answer_seconds_max'], '.0f')} s to "
                f"answer {_source(r, 'q')['test_size']} inputs (CPU)")

    return _row("per-query retrieval (BM25, top-k for each test input)",
                "`icl-ssm select --method bm25 --per-query ...`", "the paper's and OpenICL's protocol",
                cite(records, COMPARISONS + "#per-query-retrieval-bm25-and-top-k-for-each-test-input)", name,
                     order.name), {"q": read(records, name), "o": order}, ours)


SELECT = {"k20": "synthetic-products-select-k20.json", "k60": "synthetic-products-select-k5-60.json",
          "relu": "synthetic-relu-select-k5-60.json"}
FIDELITY = {"q64": "synthetic-products-fidelity-q64.json", "q16": "synthetic-products-fidelity-q16.json",
            "rfid": "synthetic-relu-fidelity-k20-40-60.json"}


def _synthetic_text(r: Record) -> str:
    """The synthetic case study: selection at k = 20, against k, the cost, the ReLU figure."""
    k20 = lambda m, key="mse": val(r[f"k20.k20.{m}.{key}"], ".3f" if key == "mse" else ".2f")  # noqa: E731
    ks, rks = _source(r, "k60")["ks"], _source(r, "relu")["ks"]
    v = lambda key: r[key].value  # noqa: E731
    return (f"SSM on products (`--pair-size`), k = 20, {r['k20.k20.random.mse'].n} seeds: dense "
            f"{k20('affinity-dense')}, compressed {k20('affinity-compressed')}, random {k20('random')}, top-k "
            f"{k20('topk')}; D1 share {k20('affinity-dense', 'd1_share')} / {k20('affinity-compressed', 'd1_share')}; "
            f"k = {ks[0]}-{ks[-1]} on a {ks[-1]}-pair teacher ({r[f'k60.k{ks[0]}.random.mse'].n} seeds): compressed "
            f"within {v('k60.close_gap_max'):.0%} of dense only from k = {v('k60.close_from')} "
            f"({v('k60.k40.gap'):.0%} behind at k = 40: {val(r['k60.k40.affinity-compressed.mse'], '.3f')} against "
            f"{val(r['k60.k40.affinity-dense.mse'], '.3f')}), both below random and top-k from k = "
            f"{v('k60.below_from')}; cache build {v('q64.cache_flop_ratio'):.1f}x cheaper than the dense prefill at "
            f"k = 20, {v('q16.flop_ratio'):.1f}x per evaluated subset with {_source(r, 'q16')['queries']} queries "
            f"(CPU). ReLU (a teacher carried from the linear one): compressed more than 0.05 below random from k = "
            f"{v('relu.below_random_from')}, below top-k from k = {v('relu.below_topk_from')} "
            f"({r[f'relu.k{rks[0]}.random.mse'].n} seeds), Spearman {val(r['rfid.compressed_spearman_min'])}-"
            f"{val(r['rfid.compressed_spearman_max'])}")


def synthetic(records: Records) -> Row:
    """The synthetic case study in one row (:func:`_synthetic_text`)."""
    names = SELECT | FIDELITY
    return _row("synthetic in-context regression (linear and ReLU; test MSE against k; D1 share)",
                "`icl-ssm synthetic train`, `distill`, `select --k 5 10 20 30 40 50 60`",
                "compressed as good as dense; 15.7x fewer FLOPs",
                cite(records, SYNTHETIC, SELECT["k20"], SELECT["k60"], FIDELITY["q64"], FIDELITY["q16"],
                     SELECT["relu"], FIDELITY["rfid"]),
                {a: read(records, n) for a, n in names.items()}, _synthetic_text)


def probe_and_length(records: Records) -> list[Row]:
    """The flipped-label probe and length generalisation."""
    probes = {"syn": "synthetic-products-probe.json", "g": "flipped-rotten_tomatoes-k20-G-state.json"}
    probe = _row("flipped-label probe (the state's input-label blindness)",
                 "`icl-ssm synthetic probe`; `python research/flipped_labels.py --compressor G`", "—",
                 cite(records, SYNTHETIC, *probes.values()), {a: read(records, n) for a, n in probes.items()},
                 lambda r: (f"synthetic: dense {val(r['syn.dense.rise'], '+.2f')}, compressed "
                            f"{val(r['syn.compressed.rise'], '+.2f')} with products (`--pair-size`); Rotten Tomatoes: "
                            f"dense {est(r['g.dense.loss_change'], '+.3f')}, compressed "
                            f"{est(r['g.compressed.loss_change'], '+.3f')} (CPU)"))
    name = "length-rotten_tomatoes.json"

    def ours(r: Record) -> str:
        c = _source(r, "len")
        inside, past = c["ks_in_context"], c["ks_past_context"]
        return (f"trained at k = {c['trained_k']}: KL {' / '.join(val(r[f'len.k{k}.kl'], '.3f') for k in inside)} "
                f"at k = {' / '.join(map(str, inside))}; past the {c['context']:,}-token context (k = {past[0]}-"
                f"{past[-1]:,}) no dense reference; compressed {r['len.compressed.flops_min'].value / 1e9:.0f}-"
                f"{r['len.compressed.flops_max'].value / 1e9:.0f} GFLOP per prompt up to "
                f"{r['len.prompt_tokens_max'].value / 1000:.0f}k tokens (CPU)")

    length = _row("length generalisation (to 1,000 demonstrations)",
                  "`icl-ssm bench length --k 50 100 150 250 400 1000 --out O`", "error stays low far past training",
                  cite(records, COMPARISONS + "#length-generalisation-one-compressor-from-k--50-to-k--1000)", name)
                  + ", [plot](docs/figures/length-rotten_tomatoes.png)", {"len": read(records, name)}, ours)
    return [probe, length]


TRANSFER = tuple(f"transfer-{t}-k20-64ep.json" for t in ("rotten_tomatoes", "cr", "coin_flip", "modular_addition"))


def transfer(records: Records) -> Row:
    """The 4-task transfer matrix: transfers at or below the target's native KL, and the sources as they are."""
    def ours(r: Record) -> str:
        c = _source(r, "m")
        n = r["m.transfers"].value
        return (f"the full {len(c['tasks'])}-task matrix ({n} transfers) at 64 episodes: {r['m.at_or_below'].value} of "
                f"{n} transfers at or below the target's native KL (all into "
                f"{' and '.join(f'`{t}`' for t in c['met_into'])}; the rest within {val(r['m.above_min'], '.3f')}-"
                f"{val(r['m.above_max'], '.3f')}), e.g. {val(r['m.rotten_tomatoes.from-cr.kl'], '.3f')} from `cr` "
                f"against {val(r['m.rotten_tomatoes.compressed.kl'], '.3f')} native on Rotten Tomatoes; the source "
                f"compressors used without stage 2 are worse than the window in {r['m.as_is_worse'].value} of "
                f"{r['m.as_is'].value}; {c['subsets']} x {c['queries']} held-out, so no ranking claim (CPU)")

    return _row("cross-task transfer (stage 2 only from another task's compressor)",
                "`research/transfer_nv_inputs.sh OUT transfer` (`distill --init-from DIR`), "
                "`python research/transfer_table.py OUT`", "65% fewer GPU hours",
                cite(records, COMPARISONS + "#the-transfer-matrix-at-half-the-recipes-episodes-2-core-cpu)", *TRANSFER),
                {"m": transfer_matrix([read(records, n) for n in TRANSFER])}, ours)


NV = {"rt": "nv-rotten_tomatoes-k50.json", "cf": "nv-coin_flip-k50.json", "abl": "ablation-modular_addition-k20.json"}
NV_PATHS = ("nv4", "compressed", "nv64")


def _n_v_text(r: Record) -> str:
    """n_v at k = 50 (one H200) and at k = 20 (the modular_addition ablation)."""
    rt, abl = _source(r, "rt"), _source(r, "abl")
    sizes = " / ".join(str(rt["num_virtual"] if p == "compressed" else int(p[2:])) for p in NV_PATHS)
    mse = lambda t: " / ".join(val(r[f"{t}.{p}.logit_mse"]) for p in NV_PATHS)  # noqa: E731
    drop = " / ".join(f"{100 * r[f'rt.{p}.acc_minus_dense'].value:+.1f}" for p in NV_PATHS)
    nvs = sorted([abl["num_virtual"], *(int(p[2:]) for p in abl["paths"] if p.startswith("nv"))])
    span = lambda key, spec=".3f": f"{val(r[f'{key}_min'], spec)}-{val(r[f'{key}_max'], spec)}"  # noqa: E731
    return (f"k = {rt['k']}, n_v {sizes}: output MSE {mse('rt')} (Rotten Tomatoes) and {mse('cf')} (`coin_flip`), "
            f"{'every one' if r['mse_minus_control_max'].value < 0 else 'not every one'} below the control "
            f"({val(r['rt.control.logit_mse'])} / {val(r['cf.control.logit_mse'])}); accuracy minus dense on Rotten "
            f"Tomatoes {drop} points; KL {span('rt_kl')} and {span('cf_kl')}; {rt['subsets']} x {rt['queries']} "
            f"held-out, no ranking claim (one H200, TF32). k = 20 (`modular_addition`): Spearman "
            f"{span('abl_spearman', '.2f')} and KL {span('abl_kl')} for n_v {nvs[0]}-{nvs[-1]} (CPU)")


def n_v(records: Records) -> Row:
    """n_v and the output error: k = 50 on Rotten Tomatoes and ``coin_flip``, k = 20 on ``modular_addition``."""
    sources = {a: read(records, n) for a, n in NV.items()}
    small = ["compressed", *(p for p in sources["abl"].config["paths"] if p.startswith("nv"))]
    stats = {f"{t}_kl_{s}": (s, [f"{t}.{p}.kl" for p in NV_PATHS]) for t in ("rt", "cf") for s in ("min", "max")}
    stats |= {f"abl_{key}_{s}": (s, [f"abl.{p}.{key}" for p in small]) for key in ("spearman", "kl")
              for s in ("min", "max")}
    stats["mse_minus_control_max"] = ("max", [f"{t}.{p}.logit_mse_minus_control" for t in ("rt", "cf")
                                              for p in NV_PATHS])
    return _row("n_v and the output error",
                "`research/ablation.sh` (n_v 2-32, k = 20); `research/transfer_nv_inputs.sh OUT nv` (k = 50, with "
                "`logit_mse`)", "a table at several n_v",
                cite(records, "[n_v at k = 50](docs/research/paper-comparisons.md#n_v-at-k--50-with-the-output-mse-one-"
                     "h200), [ablations](docs/research/ablations.md)", *NV.values()), sources, _n_v_text, stats)


def paper_artefacts(records: Records) -> str:
    """BENCHMARKS' 'The paper's artefacts': each table and figure, the paper's number and ours."""
    order = read(records, "select-order-k20-bridge-gradce.json")
    (report,) = order.config["sets"]
    order = order.part(report)
    # the recipe's row measures nothing: its settings are prose, made by the page it links
    recipe = Row(Record({"docs/paper.md": None}, {
        "artefact": "the paper's recipe", "command": "`icl-ssm distill --recipe paper`, `select --recipe paper`, "
                                                     "`run --recipe paper`", "paper": "—",
        "ours (machine)": "the departures and their measurements",
        "record": "[paper.md](docs/paper.md#where-the-defaults-depart-from-the-paper)"}, {}, {}, "the paper's recipe"))
    rows = [output_error(records), flops(records), long_context(records), main_selection(records, order),
            per_query(records, order), synthetic(records), *probe_and_length(records), transfer(records),
            n_v(records), recipe]
    return render_rows(rows, HEADERS)
