"""BENCHMARKS' 'The paper's artefacts': each table and figure of the paper, the paper's number and ours.

One row per artefact, each from the records of its own measurement: the output error (fidelity and
``bench long-context`` records), the FLOP saving (``bench select-cost``), the long-context methods at the
same cache size, the main selection table with BRIDGE and GradCE and per-query retrieval, the synthetic case
study in one row (the synthetic records), the flipped-label probe, length generalisation (``bench length``),
the 4-task transfer matrix and n_v (fidelity reports with ``--also`` paths).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from .base import Records, cite, mean_sd, pct, table
from .fidelity import fidelity
from .selection import orders_averaged
from .ssm_reads import flip
from .synthetic import from_k, synthetic_mse


def long_context(records: Records) -> str:
    """The long-context comparison at the same cache size: KL, cache memory and FLOPs per path."""
    two = lambda x: f"{x:#.2g}"  # noqa: E731
    tasks = {}
    for task in ("rotten_tomatoes", "coin_flip"):
        for r in records(f"long-context-{task}-k50-k75.json")["results"]:
            tasks.setdefault(task, {})[r["k"]] = {row["path"]: row for row in r["rows"]}
    rt, cf = tasks["rotten_tomatoes"], tasks["coin_flip"]
    ks = sorted(rt)
    per = lambda t, path, key, fmt: " / ".join(fmt(t[k][path][key]) for k in ks)  # noqa: E731
    kl = lambda t, path, fmt=two: per(t, path, "kl", fmt)  # noqa: E731
    three = lambda x: f"{x:.3f}"  # noqa: E731
    share = lambda x: f"{x:.2f}"  # noqa: E731
    others = [t[k][p]["flops_vs_dense"] for t in (rt, cf) for k in ks for p in ("streaming", "lm-infinite")]
    dense_mib = [rt[k]["dense"]["cache_mib"] for k in ks]
    overlap = all(t[k]["compressed"]["spearman_ci95"][0] <= t[k][p]["spearman_ci95"][1]
                  and t[k][p]["spearman_ci95"][0] <= t[k]["compressed"]["spearman_ci95"][1]
                  for t in (rt, cf) for k in ks for p in ("window", "streaming", "lm-infinite"))
    subsets = records("long-context-rotten_tomatoes-k50-k75.json")["subsets"]
    return (f"Rotten Tomatoes ({rt[ks[0]]['compressed']['slots']} slots): KL {kl(rt, 'compressed', three)} "
            f"(k = {' / '.join(map(str, ks))}) against window {kl(rt, 'window')}, StreamingLLM {kl(rt, 'streaming')}, "
            f"LM-Infinite {kl(rt, 'lm-infinite')}; `coin_flip` ({cf[ks[0]]['compressed']['slots']} slots): KL "
            f"{kl(cf, 'compressed', three)} against window {kl(cf, 'window')}, StreamingLLM {kl(cf, 'streaming')}, "
            f"LM-Infinite {kl(cf, 'lm-infinite')}, control {kl(cf, 'control', three)}; "
            f"{rt[ks[0]]['compressed']['cache_mib']:.1f} MiB of cache against "
            f"{min(dense_mib):.0f}-{max(dense_mib):.0f} MiB; {per(rt, 'compressed', 'flops_vs_dense', share)} of the "
            f"dense FLOPs on Rotten Tomatoes, {per(cf, 'compressed', 'flops_vs_dense', share)} on `coin_flip`, "
            f"attention counted (the other two: {min(others):.2f}-{max(others):.2f}, they need the dense prefill); "
            f"ranking Spearman intervals {'overlap' if overlap else 'do not all overlap'} at {subsets} subsets (CPU)")


def transfer_matrix(records: Records) -> tuple[str, list[str]]:
    """The 4-task transfer matrix: transfers at or below the target's native KL, and the sources as they are."""
    names = [f"transfer-{t}-k20-64ep.json" for t in ("rotten_tomatoes", "cr", "coin_flip", "modular_addition")]
    reports = {r["task"]: r for r in (records(n) for n in names)}
    excess, beaten, as_is = {}, [], 0
    for task, r in reports.items():
        for path, v in r["also"].items():
            if path.startswith("from-"):
                excess[path[5:], task] = v["kl"] - r["kl"]
            elif path.startswith("as-is-"):
                beaten.append(v["kl"] > r["window_kl"])
                as_is += 1
    met = [kt for kt, d in excess.items() if d <= 0]
    into = sorted({f"`{t}`" for _, t in met if all(excess[s, t2] <= 0 for s, t2 in excess if t2 == t)})
    rest = [d for d in excess.values() if d > 0]
    rt = reports["rotten_tomatoes"]
    r0 = next(iter(reports.values()))
    text = (f"the full {len(reports)}-task matrix ({len(excess)} transfers) at 64 episodes: {len(met)} of "
            f"{len(excess)} transfers at or below the target's native KL (all into {' and '.join(into)}; the rest "
            f"within {min(rest):.3f}-{max(rest):.3f}), e.g. {rt['also']['from-cr']['kl']:.3f} from `cr` against "
            f"{rt['kl']:.3f} native on Rotten Tomatoes; the source compressors used without stage 2 are worse than the "
            f"window in {sum(beaten)} of {as_is}; {r0['subsets']} x {r0['queries']} held-out, so no ranking claim "
            "(CPU)")
    return text, names


def n_v(records: Records) -> tuple[str, list[str]]:
    """n_v at k = 50 (one H200) and at k = 20 (the modular_addition ablation)."""
    names = ["nv-rotten_tomatoes-k50.json", "nv-coin_flip-k50.json", "ablation-modular_addition-k20.json"]
    rt, cf, abl = (records(n) for n in names)
    paths = ("nv4", "compressed", "nv64")
    sizes = " / ".join(str(rt["num_virtual"] if p == "compressed" else int(p[2:])) for p in paths)
    mse = lambda r: " / ".join(f"{fidelity(r, p, 'logit_mse'):.2f}" for p in paths)  # noqa: E731
    kls = lambda r: [fidelity(r, p, "kl") for p in paths]  # noqa: E731
    below = all(fidelity(r, p, "logit_mse") < r["control_logit_mse"] for r in (rt, cf) for p in paths)
    drop = " / ".join(f"{100 * (fidelity(rt, p, 'acc') - rt['acc_dense']):+.1f}" for p in paths)
    small = {"compressed": abl}
    small.update({p: abl["also"][p] for p in abl["also"] if p.startswith("nv")})
    rho20 = [fidelity(abl, p, "subset_loss_spearman") for p in small]
    kl20 = [fidelity(abl, p, "kl") for p in small]
    nvs = sorted([abl["num_virtual"], *(int(p[2:]) for p in small if p != "compressed")])
    text = (f"k = {rt['k']}, n_v {sizes}: output MSE {mse(rt)} (Rotten Tomatoes) and {mse(cf)} (`coin_flip`), "
            f"{'every one' if below else 'not every one'} below the control ({rt['control_logit_mse']:.2f} / "
            f"{cf['control_logit_mse']:.2f}); accuracy minus dense on Rotten Tomatoes {drop} points; KL "
            f"{min(kls(rt)):.3f}-{max(kls(rt)):.3f} and {min(kls(cf)):.3f}-{max(kls(cf)):.3f}; {rt['subsets']} x "
            f"{rt['queries']} held-out, no ranking claim (one H200, TF32). k = 20 (`modular_addition`): Spearman "
            f"{min(rho20):.2f}-{max(rho20):.2f} and KL {min(kl20):.3f}-{max(kl20):.3f} for n_v {nvs[0]}-{nvs[-1]} "
            "(CPU)")
    return text, names


def paper_fidelity_cost(records: Records) -> list[list[str]]:
    """The paper's artefacts: the output error, the FLOP saving, the long-context methods."""
    rows = []
    k20, lc = records("ssm-input-rotten_tomatoes-k20.json"), records("long-context-rotten_tomatoes-k50-k75.json")
    comp = [next(row for row in r["rows"] if row["path"] == "compressed") for r in lc["results"]]
    errs, kls = [c["rel_logit_err"] for c in comp], [k20["kl"], *(c["kl"] for c in comp)]
    rows.append([
        "output error of the compressed cache (Algorithm 1)",
        "`icl-ssm fidelity --task rotten_tomatoes --k 20 --compressor G --subsets 30 --queries 32`", "< 0.7%",
        f"relative logit error {pct(k20['rel_logit_err'])}% (k = 20), {pct(min(errs), 0)}-{pct(max(errs), 0)}% "
        f"(k = {' and '.join(str(r['k']) for r in lc['results'])}); KL {min(kls):.3f}-{max(kls):.3f} (CPU)",
        cite(records, "[fidelity targets](docs/research/fidelity-targets.md)", "ssm-input-rotten_tomatoes-k20.json",
             "long-context-rotten_tomatoes-k50-k75.json")])

    cost, wall = records("select-cost-attention.json"), records("select-cost-wall-attention.json")
    per_query = next(r for r in cost["rows"] if r["k"] == 50 and r["evaluator"] == "dense-per-query")
    packed = next(r for r in wall["rows"] if r["k"] == 50 and r["evaluator"] == "dense-packed")
    rows.append([
        "FLOPs per evaluated subset, compressed vs dense per query",
        "`icl-ssm bench select-cost --compressor DIR --k 20 50 200 --queries 16 --subsets 1 --per-query-max-k 50`",
        "14.2x fewer",
        f"{per_query['flops_vs_compressed']:.1f}x at k = 50, {cost['queries']} queries, the 36-slot k = 20 compressor "
        f"read at k = 50, attention counted (against a dense prefix shared by {wall['queries']} queries, packed: "
        f"{packed['flops_vs_compressed']:.1f}x, attention counted) (CPU)",
        cite(records, "[cost](docs/research/selection-cost.md)", "select-cost-attention.json",
             "select-cost-wall-attention.json")])

    rows.append([
        "against long-context methods at the same cache size (error, FLOPs, memory)",
        "`icl-ssm bench long-context --tasks rotten_tomatoes coin_flip --k 50 75 --subsets 12 --queries 8 --out O` "
        "(`coin_flip`: `--compressor coin_flip=DIR`)",
        "the compressor ahead of StreamingLLM, LM-Infinite and the trained systems",
        long_context(records)
        + ". Trained systems: not built ([paper.md](docs/paper.md#comparison-systems-not-built-here))",
        cite(records, "[comparisons](docs/research/paper-comparisons.md"
                      "#long-context-methods-at-the-same-cache-size-rotten-tomatoes-and-coin_flip-k--50-and-75)",
             "long-context-rotten_tomatoes-k50-k75.json", "long-context-coin_flip-k50-k75.json")
        + ", [plot](docs/figures/long-context-rotten_tomatoes.png)"])
    return rows


def paper_selection(records: Records) -> list[list[str]]:
    """The paper's artefacts: the main selection table and per-query retrieval."""
    rows = []
    order = records("select-order-k20-bridge-gradce.json")
    acc = orders_averaged(order)
    seeds = len(acc["affinity"])
    best = max(("bridge:dense", "topk", "random", "bm25", "gradce"), key=lambda m: statistics.fmean(acc[m]))
    behind = statistics.fmean(acc[best]) - statistics.fmean(acc["affinity"])
    rows.append([
        "main selection table (random, BM25, top-k, GradCE, BRIDGE, + Algorithm 1 rows, zero-shot)",
        "`icl-ssm bench select-quality --methods affinity affinity:dense bridge bridge:dense random bm25 topk gradce "
        "...`, then `bench select-order --permutations 8`",
        "+6.48 points over the best baseline",
        f"Rotten Tomatoes, k = 20, {seeds} seeds x {order['provenance']['test_examples']} test reviews, orders "
        f"averaged (± sample sd over seeds): affinity {mean_sd(acc['affinity'])} (dense "
        f"{mean_sd(acc['affinity:dense'])}); "
        f"BRIDGE {mean_sd(acc['bridge:dense'])} (+ Algorithm 1: {mean_sd(acc['bridge'])}); top-k "
        f"{pct(statistics.fmean(acc['topk']))}, random {pct(statistics.fmean(acc['random']))}, BM25 "
        f"{pct(statistics.fmean(acc['bm25']))}, GradCE {mean_sd(acc['gradce'])}, zero-shot "
        f"{pct(statistics.fmean(acc['zero-shot']))}: affinity {100 * abs(behind):.1f} "
        f"{'below' if behind > 0 else 'above'} the best baseline (CPU)",
        cite(records, "[comparisons](docs/research/paper-comparisons.md"
                      "#the-selection-table-with-bridge-gradce-and-a-zero-shot-row-rotten-tomatoes-k--20)",
             "select-order-k20-bridge-gradce.json")])

    runs = records("per-query-k20-rotten_tomatoes.json")
    by = defaultdict(list)
    for r in sorted(runs, key=lambda r: r["seed"]):
        by[r["method"]].append(r)
    retrieval = {m: [r["test_accuracy"] for r in by[f"{m} (per query)"]] for m in ("bm25", "topk")}
    answer = [r["answer_flops"] for rs in by.values() for r in rs]
    seconds = [r["answer_seconds"] for rs in by.values() for r in rs]
    rows.append([
        "per-query retrieval (BM25, top-k for each test input)", "`icl-ssm select --method bm25 --per-query ...`",
        "the paper's and OpenICL's protocol",
        f"Rotten Tomatoes, k = 20, {len(retrieval['bm25'])} seeds: BM25 {mean_sd(retrieval['bm25'])}, top-k "
        f"{mean_sd(retrieval['topk'])} (one set per task: {pct(statistics.fmean(acc['bm25']))} and "
        f"{pct(statistics.fmean(acc['topk']))} orders averaged); {min(answer) / 1e12:.0f}-{max(answer) / 1e12:.0f} "
        f"TFLOP and {min(seconds):.0f}-{max(seconds):.0f} s to answer {runs[0]['test_size']} inputs (CPU)",
        cite(records, "[comparisons](docs/research/paper-comparisons.md"
                      "#per-query-retrieval-bm25-and-top-k-for-each-test-input)", "per-query-k20-rotten_tomatoes.json",
             "select-order-k20-bridge-gradce.json")])
    return rows


def paper_probe_length(records: Records) -> list[list[str]]:
    """The paper's artefacts: the flipped-label probe and length generalisation."""
    rows = []
    probe, g = records("synthetic-products-probe.json"), records("flipped-rotten_tomatoes-k20-G-state.json")
    rows.append([
        "flipped-label probe (the state's input-label blindness)",
        "`icl-ssm synthetic probe`; `python research/flipped_labels.py --compressor G`", "—",
        f"synthetic: dense {probe['dense']['diff']:+.2f}, compressed {probe['compressed']['diff']:+.2f} with products "
        f"(`--pair-size`); Rotten Tomatoes: dense {flip(g, 'dense')}, compressed {flip(g)} (CPU)",
        cite(records, "[synthetic](docs/research/synthetic-regression.md), "
                      "[products](docs/research/ssm-input.md#products-of-neighbouring-tokens)",
             "synthetic-products-probe.json", "flipped-rotten_tomatoes-k20-G-state.json")])

    length = records("length-rotten_tomatoes.json")
    inside = [r for r in length["rows"] if r["in_context"]]
    past = [r for r in length["rows"] if not r["in_context"]]
    gflops = [r["compressed"]["flops"] / 1e9 for r in length["rows"]]
    kls_inside = [r["kl"] for r in inside]
    rows.append([
        "length generalisation (to 1,000 demonstrations)",
        "`icl-ssm bench length --k 50 100 150 250 400 1000 --out O`", "error stays low far past training",
        f"trained at k = {length['trained_k']}: KL {' / '.join(f'{kl:.3f}' for kl in kls_inside)} at k = "
        f"{' / '.join(str(r['k']) for r in inside)}; past the {length['context']:,}-token context (k = {past[0]['k']}-"
        f"{past[-1]['k']:,}) no dense reference; compressed {min(gflops):.0f}-{max(gflops):.0f} GFLOP per prompt up to "
        f"{max(r['prompt_tokens'] for r in length['rows']) / 1000:.0f}k tokens (CPU)",
        cite(records, "[comparisons](docs/research/paper-comparisons.md"
                      "#length-generalisation-one-compressor-from-k--50-to-k--1000)", "length-rotten_tomatoes.json")
        + ", [plot](docs/figures/length-rotten_tomatoes.png)"])
    return rows


def paper_artefacts(records: Records) -> str:
    """BENCHMARKS' 'The paper's artefacts': each table and figure, the paper's number and ours."""
    rows = []
    rows += paper_fidelity_cost(records)
    rows += paper_selection(records)
    rows.append(synthetic_artefact(records))
    rows += paper_probe_length(records)
    text, names = transfer_matrix(records)
    rows.append([
        "cross-task transfer (stage 2 only from another task's compressor)",
        "`research/transfer_nv_inputs.sh OUT transfer` (`distill --init-from DIR`), "
        "`python research/transfer_table.py OUT`", "65% fewer GPU hours", text,
        cite(records, "[comparisons](docs/research/paper-comparisons.md"
                      "#the-transfer-matrix-at-half-the-recipes-episodes-2-core-cpu)", *names)])
    text, names = n_v(records)
    rows.append([
        "n_v and the output error",
        "`research/ablation.sh` (n_v 2-32, k = 20); `research/transfer_nv_inputs.sh OUT nv` (k = 50, with `logit_mse`)",
        "a table at several n_v", text,
        cite(records, "[n_v at k = 50](docs/research/paper-comparisons.md#n_v-at-k--50-with-the-output-mse-one-h200), "
                      "[ablations](docs/research/ablations.md)", *names)])
    rows.append([
        "the paper's recipe", "`icl-ssm distill --recipe paper`, `select --recipe paper`, `run --recipe paper`", "—",
        "the departures and their measurements", "[paper.md](docs/paper.md#where-the-defaults-depart-from-the-paper)"])
    return table(["artefact", "command", "paper", "ours (machine)", "record"], rows)


def synthetic_artefact(records: Records) -> list[str]:
    """The synthetic case study in one row: selection at k = 20, against k, the cost, the ReLU figure."""
    k20 = {key: statistics.fmean(v) for key, v in synthetic_mse(records("synthetic-products-select-k20.json")).items()}
    sel = records("synthetic-products-select-k20.json")
    share = [statistics.fmean(r[m]["d1_share"] for r in sel["rows"]) for m in ("affinity-dense", "affinity-compressed")]
    k60 = synthetic_mse(records("synthetic-products-select-k5-60.json"))
    acc = {key: statistics.fmean(v) for key, v in k60.items()}
    ks = sorted({k for k, _ in acc})
    gap = {k: acc[k, "affinity-compressed"] / acc[k, "affinity-dense"] - 1 for k in ks}
    close = from_k(ks, lambda k: gap[k] <= 0.10)
    below = from_k(ks, lambda k: max(acc[k, "affinity-dense"], acc[k, "affinity-compressed"])
                   < min(acc[k, "random"], acc[k, "topk"]))
    q64, q16 = records("synthetic-products-fidelity-q64.json"), records("synthetic-products-fidelity-q16.json")
    relu = {key: statistics.fmean(v) for key, v in synthetic_mse(records("synthetic-relu-select-k5-60.json")).items()}
    rks = sorted({k for k, _ in relu})
    under = {b: from_k(rks, lambda k, b=b: relu[k, b] - relu[k, "affinity-compressed"] > 0.05)
             for b in ("random", "topk")}
    fid = records("synthetic-relu-fidelity-k20-40-60.json")
    ranks = [fid[key]["compressed"]["spearman"] for key in ("k20", "k40", "k60")]
    return [
        "synthetic in-context regression (linear and ReLU; test MSE against k; D1 share)",
        "`icl-ssm synthetic train`, `distill`, `select --k 5 10 20 30 40 50 60`",
        "compressed as good as dense; 15.7x fewer FLOPs",
        f"SSM on products (`--pair-size`), k = 20, {len(sel['rows'])} seeds: dense {k20[20, 'affinity-dense']:.3f}, "
        f"compressed {k20[20, 'affinity-compressed']:.3f}, random {k20[20, 'random']:.3f}, top-k "
        f"{k20[20, 'topk']:.3f}; "
        f"D1 share {share[0]:.2f} / {share[1]:.2f}; k = {ks[0]}-{ks[-1]} on a {ks[-1]}-pair teacher "
        f"({len(k60[ks[0], 'random'])} seeds): compressed within {max(gap[k] for k in ks if k >= close):.0%} of dense "
        f"only from k = {close} ({gap[40]:.0%} behind at k = 40: {acc[40, 'affinity-compressed']:.3f} against "
        f"{acc[40, 'affinity-dense']:.3f}), both below random and top-k from k = {below}; cache build "
        f"{q64['cache_flop_ratio']:.1f}x cheaper than the dense prefill at k = 20, {q16['flop_ratio']:.1f}x per "
        f"evaluated subset with {q16['queries']} queries (CPU). ReLU (a teacher carried from the linear one): "
        f"compressed more than 0.05 below random from k = {under['random']}, below top-k from k = {under['topk']} "
        f"({len(synthetic_mse(records('synthetic-relu-select-k5-60.json'))[rks[0], 'random'])} seeds), Spearman "
        f"{min(ranks):.2f}-{max(ranks):.2f}",
        cite(records, "[synthetic](docs/research/synthetic-regression.md), "
                      "[products](docs/research/ssm-input.md#products-of-neighbouring-tokens)",
             "synthetic-products-select-k20.json", "synthetic-products-select-k5-60.json",
             "synthetic-products-fidelity-q64.json", "synthetic-products-fidelity-q16.json",
             "synthetic-relu-select-k5-60.json", "synthetic-relu-fidelity-k20-40-60.json")]
