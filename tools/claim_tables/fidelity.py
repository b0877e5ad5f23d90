"""BENCHMARKS' 'Distillation and fidelity' and 'Compressed caches': summary rows (:mod:`.rows`) over the
fidelity records (``readers/fidelity.py``). No record of the compressed-caches section is stored, so that table
is the line saying so. :func:`held_out` says what a source's fidelity numbers rest on.
"""

from __future__ import annotations

from icl_ssm.records import Record

from .base import BENCH, Records, cite, no_record_yet, pct
from .rows import Row, est, render_rows, row, val

__all__ = ["held_out", "compressed_caches", "distillation_fidelity"]


def held_out(r: Record, alias: str) -> str:
    """What the fidelity numbers of source ``alias`` rest on: its held-out subsets and validation queries."""
    config = r.config["sources"][alias]
    return f"{config['subsets']} subsets x {config['queries']} queries"


# -- the tables -----------------------------------------------------------------------------------------

compressed_caches = no_record_yet("were measured by hand or computed from configs")
compressed_caches.__doc__ = "BENCHMARKS' 'Compressed caches': no row of it is stored as a record yet."

K20 = {"g0": "ssm-input-rotten_tomatoes-k20.json", "g12": "seeds-rotten_tomatoes-k20.json"}
K50 = {"s0": "k50-recent128-rotten_tomatoes.json", "s1": "k50-recent128-seed1-rotten_tomatoes.json"}
TARGETS = "[targets](docs/research/fidelity-targets.md)"
SEEDS = {"G": ["g0.compressed", "g12.compressed", "g12.G-s2"], "control": ["g0.control", "g12.control",
                                                                         "g12.control-s2"]}
ABLATED = ("rotten_tomatoes", "modular_addition", "coin_flip")


def _k20_seeds_stats() -> dict[str, tuple[str, list[str]]]:
    """G's and its control's Spearman over the three training seeds (mean, sd) and G's accuracy (min, max)."""
    stats = {f"{p}_{s}": (s, [f"{x}.spearman" for x in paths]) for p, paths in SEEDS.items() for s in ("mean", "sd")}
    return stats | {f"acc_{s}": (s, [f"{x}.acc" for x in SEEDS["G"]]) for s in ("min", "max")}


def _ranking(records: Records) -> list[Row]:
    k20 = row(records, "ranking, k = 20", K20, {
        "measure": "ranking, k = 20",
        "command": "`icl-ssm fidelity --task rotten_tomatoes --k 20 --compressor G --control Gc --subsets 30 "
                   "--queries 32`",
        "machine": "CPU", "goal": ">= 0.8, clearly above control and window",
        "record": cite(records, "[seeds](docs/research/distillation-recipe.md"
                                "#spread-over-training-seeds-g-and-its-control-3-seeds-each)", *K20.values())},
        {"measured": lambda r: (
            f"G {val(r['G_mean'])} ± {val(r['G_sd'])} (3 training seeds; shipped seed "
            f"{est(r['g0.compressed.spearman'])}); control {val(r['control_mean'])} ± {val(r['control_sd'])}; "
            f"window {est(r['g0.window.spearman'])}; {held_out(r, 'g0')}, intervals resample the subsets, ± sample "
            "sd over training seeds")}, _k20_seeds_stats())
    k50 = row(records, "ranking, k = 50", K50 | {"big": "ssm-input-rotten_tomatoes-k50-96x64.json"}, {
        "measure": "ranking, k = 50",
        "command": "`icl-ssm distill --k 50 --num-recent 128 --out G128`, then `icl-ssm fidelity --task "
                   "rotten_tomatoes --k 50 --compressor G128` (the rerun: `--subsets 96 --queries 64`)",
        "machine": "CPU", "goal": ">= 0.8",
        "record": cite(records, "[exact tokens](docs/research/exact-tokens.md#128-recent-tokens-at-k--50)",
                       *K50.values(), "ssm-input-rotten_tomatoes-k50-96x64.json")},
        {"measured": lambda r: (
            f"{held_out(r, 's0')}: G128 {est(r['s0.compressed.spearman'])}, {est(r['s1.compressed.spearman'])} "
            f"(2 training seeds); control {val(r['s0.control.spearman'])}, {val(r['s1.control.spearman'])}; window "
            f"{est(r['s0.window.spearman'])}. **The shipped G128 rerun on {held_out(r, 'big')}: "
            f"{est(r['big.compressed.spearman'])}; control {est(r['big.control.spearman'])}; window "
            f"{est(r['big.window.spearman'])}**; intervals resample the subsets")})
    return [k20, k50]


def _outputs(records: Records) -> list[Row]:
    kl = row(records, "KL", K20 | K50 | {"coin": "gpu-coin_flip-k20-512ep.json"}, {
        "measure": "KL to the dense answer distribution", "command": "`icl-ssm fidelity`",
        "machine": "CPU; H100 for `coin_flip`", "goal": "<= 0.02 nats",
        "record": cite(records, TARGETS, K20["g0"], *K50.values(), "gpu-coin_flip-k20-512ep.json")},
        {"measured": lambda r: (
            f"G {val(r['g0.compressed.kl'], '.3f')} (k = 20); G128 {val(r['s0.compressed.kl'], '.3f')}, "
            f"{val(r['s1.compressed.kl'], '.3f')} (2 seeds); `coin_flip` {val(r['coin.compressed.kl'], '.4f')} "
            f"(H100); {held_out(r, 'g0')}, `coin_flip` {held_out(r, 'coin')}")})
    err = row(records, "relative error", K20 | K50 | {"r50": "recency-k50-rotten_tomatoes.json"}, {
        "measure": "relative error of the answer logits", "command": "`icl-ssm fidelity`", "machine": "CPU",
        "goal": "<= 0.5%",
        "record": cite(records, TARGETS, K20["g0"], *K50.values(), "recency-k50-rotten_tomatoes.json")},
        {"measured": lambda r: (
            f"G {pct(r['g0.compressed.rel_logit_err'].value)}%; G128 {pct(r['s0.compressed.rel_logit_err'].value)}%, "
            f"{pct(r['s1.compressed.rel_logit_err'].value)}% (2 seeds); best exact window "
            f"{pct(r['r50.best.rel_logit_err'].value)}% (k = {r.config['sources']['r50']['k']}, "
            f"{pct(r['r50.best.share'].value, 0)}% of the prompt); {held_out(r, 'g0')}")})
    acc = row(records, "accuracy", K20 | K50, {
        "measure": "accuracy from the cache vs dense", "command": "`icl-ssm fidelity`", "machine": "CPU",
        "goal": "drop <= 1 point", "record": cite(records, TARGETS, *K20.values(), *K50.values())},
        {"measured": lambda r: (
            f"k = 20: {val(r['g0.compressed.acc'], '.3f')} vs {val(r['g0.dense.acc'], '.3f')} (shipped; "
            f"{val(r['acc_min'], '.3f')}-{val(r['acc_max'], '.3f')} over 3 seeds); k = 50: "
            f"{val(r['s0.compressed.acc'], '.3f')}, {val(r['s1.compressed.acc'], '.3f')} vs "
            f"{val(r['s0.dense.acc'], '.3f')} (2 seeds); {held_out(r, 'g0')}")}, _k20_seeds_stats())
    return [kl, err, acc]


def _exact_and_probes(records: Records) -> list[Row]:
    recency = {"r20": "recency-k20-rotten_tomatoes.json", "r50": "recency-k50-rotten_tomatoes.json"}
    exact = row(records, "exact share", recency, {
        "measure": "exact share of the prompt for Spearman 0.8 and KL 0.02",
        "command": "`python research/recency.py REPORT.json --last ... --windows ...`", "machine": "CPU",
        "goal": "—", "record": cite(records, "[exact tokens](docs/research/exact-tokens.md)", *recency.values())},
        {"measured": lambda r: (
            f"between {pct(r['r20.exact.miss'].value, 0)}% and {pct(r['r20.exact.meets'].value, 0)}% at k = 20, "
            f"between {pct(r['r50.exact.miss'].value, 0)}% and {pct(r['r50.exact.meets'].value, 0)}% at k = 50 "
            "(the largest exact window measured that misses either target, the smallest that meets both; 1 seed, "
            f"{held_out(r, 'r20')})")})
    tail = row(records, "tail readout", {"tail": "tail-readout-k20-rotten_tomatoes.json", "g0": K20["g0"]}, {
        "measure": "best ranking without a dense prefill, k = 20 (a probe)",
        "command": "`python research/tail_readout.py TEACHER_CACHE REPORT.json --control`", "machine": "CPU",
        "goal": ">= 0.8", "record": cite(records, "[ranking location](docs/research/ranking-location.md)",
                                          "tail-readout-k20-rotten_tomatoes.json")},
        {"measured": lambda r: (
            f"{est(r['tail.C4.spearman'])}, {est(r['tail.C4s1.spearman'])} (2 seeds); accuracy "
            f"{val(r['tail.C4.acc'])}, {val(r['tail.C4s1.acc'])} (answers collapse); {held_out(r, 'g0')}, "
            "intervals resample the subsets")})
    rank10 = row(records, "ranking weight 10", {"rank10": "k50-rank10-rotten_tomatoes.json",
                                                "base": "k50-rotten_tomatoes.json"}, {
        "measure": "ranking with the ranking weight 10, k = 50 (scale-invariant, 64 channels)",
        "command": "`icl-ssm distill --k 50 --lambda-rank 10 --system scale_invariant --channels 64`",
        "machine": "CPU", "goal": "—",
        "record": cite(records, "[k = 50](docs/research/k50-summary.md"
                                "#the-right-statistic-handed-over-exactly-an-oracle-summary-k--50)",
                       "k50-rank10-rotten_tomatoes.json", "k50-rotten_tomatoes.json")},
        {"measured": lambda r: (
            f"{est(r['rank10.SI64-rank10.spearman'])}; over its control ({val(r['base.control.spearman'])} on the "
            f"same subsets) {val(r['over_control'], '+.2f')}; accuracy {100 * r['acc_drop'].value:.0f} points "
            f"below dense; {held_out(r, 'rank10')}, the interval resamples the subsets")},
        {"over_control": ("minus", ["rank10.SI64-rank10.spearman", "base.control.spearman"]),
         "acc_drop": ("minus", ["rank10.dense.acc", "rank10.SI64-rank10.acc"])})
    return [exact, tail, rank10]


def _ablation(records: Records) -> Row:
    """The ablations' mean Spearman over three tasks (label-balanced where stored, as research/ablation_pooled.py)."""
    paths = ("compressed", "control", "scale-invariant", "dt1")
    stats = {f"{p}_pooled": ("mean", [f"{t}.{p}.spearman_pooled" for t in ABLATED]) for p in paths}
    stats |= {f"{p}_over_base": ("minus", [f"{p}_pooled", "compressed_pooled"]) for p in ("scale-invariant", "dt1")}

    def held(r: Record, key: str) -> str:
        return " / ".join(str(r.config["sources"][t][key]) for t in ABLATED)

    return row(records, "ablation", {t: f"ablation-{t}-k20.json" for t in ABLATED}, {
        "measure": "ablation over three tasks (k = 20): mean Spearman of each variant",
        "command": "`research/ablation.sh OUT TASK`, `python research/ablation_pooled.py ...`", "machine": "CPU",
        "goal": "the whole ablation in 2 h",
        "record": cite(records, "[ablations](docs/research/ablations.md#coin_flip-and-the-defaults-chosen-over-the-"
                                "three-tasks)", *(f"ablation-{t}-k20.json" for t in ABLATED))},
        {"measured": lambda r: (
            f"scale-invariant {val(r['scale-invariant_pooled'])} ({val(r['scale-invariant_over_base'], '+.2f')} "
            f"over the base {val(r['compressed_pooled'])}); control {val(r['control_pooled'])}; dt = 1: "
            f"{val(r['dt1_over_base'], '+.2f')} against the base; mean over {', '.join(ABLATED)}, 1 training seed, "
            f"{held(r, 'subsets')} subsets x {held(r, 'queries')} queries")}, stats)


def distillation_fidelity(records: Records) -> str:
    """BENCHMARKS' 'Distillation and fidelity'."""
    rows = [*_ranking(records), *_outputs(records), *_exact_and_probes(records), _ablation(records)]
    return render_rows(rows, BENCH)
