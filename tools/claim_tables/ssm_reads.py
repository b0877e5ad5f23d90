"""BENCHMARKS' 'What the SSM reads, on a language task': which input depth the compressor's SSM should read.

Reads, through the adapter (``readers/fidelity.py``), the ``icl-ssm fidelity --also`` reports that set the
embeddings (shipped), layers 1, 2 and 8 and the products of neighbouring tokens beside one control, at k = 20
and 50 on Rotten Tomatoes and ``coin_flip``; their joined reports (``research/join_reports.py``: paired
differences over the same subsets); and the flipped-label probes of ``research/flipped_labels.py``. Each row
is one record joined from those it reads (:func:`~claim_tables.rows.row`), rendered by the one renderer.
"""

from __future__ import annotations

from icl_ssm.records import Record

from .base import Records, cite
from .fidelity import held_out
from .rows import Row, est, interval, render_rows, row, val

HEADERS = ["measure", "command", "embeddings (shipped)", "layer 8", "control", "goal", "record"]
EMB, L8, CONTROL = HEADERS[2:5]
PAGE = "[inputs](docs/research/ssm-input.md)"
RT20 = "ssm-input-rotten_tomatoes-k20.json"
BIG = "ssm-input-rotten_tomatoes-k50-96x64.json"
SAME = {"command": "same", "goal": "—", "record": "same"}  # a row measured with the row above it


def flipped(name: str) -> str:
    return f"flipped-rotten_tomatoes-k20-{name}.json"


def both(r: Record, pair: str) -> str:
    """A paired Spearman difference with its interval over subsets and, after a semicolon, over subsets and
    queries: ``-0.01 [-0.12, +0.10; -0.15, +0.18]``."""
    ends = [f"{x:+.2f}" for key in (pair, f"{pair}_over_queries") for x in r[key].interval]
    return f"{val(r[pair], '+.2f')} [{ends[0]}, {ends[1]}; {ends[2]}, {ends[3]}]"


def gflop_share(r: Record, path: str, spec: str = ".0f") -> str:
    """``910 (0.46x)``: GFLOP per subset of a path and its share of the dense pass's."""
    return f"{val(r[f'{path}.gflop'], spec)} ({val(r[f'{path}.flops_share'])}x)"


def size(r: Record, alias: str) -> str:
    """``30 x 32``: the subsets and queries of source ``alias``."""
    config = r.config["sources"][alias]
    return f"{config['subsets']} x {config['queries']}"


def no_drift(r: Record, alias: str) -> None:
    """The joined runs' dense, control and window losses agree (else their paired differences mean nothing)."""
    drift = {k: m.value for k, m in r.metrics.items() if k.startswith(f"{alias}.drift.")}
    if any(drift.values()):
        raise ValueError(f"{r.name}: the joined runs' losses differ: {drift}")


def _k20(records: Records) -> list[Row]:
    paths = {EMB: "k20.compressed", L8: "k20.layer8", CONTROL: "k20.control"}
    spearman = row(records, "k20 spearman", {"k20": RT20}, {
        "command": "`icl-ssm fidelity ... --also layer8=DIR`", "goal": "above its control by a paired interval",
        "record": cite(records, PAGE, RT20)}, {
        "measure": lambda r: (
            f"subset-loss Spearman vs dense, k = {r.config['sources']['k20']['k']}, {size(r, 'k20')} [95% CI "
            "resampling subsets and queries; the shipped G's interval resampling subsets alone is "
            f"{interval(r['k20.compressed.spearman'])}]"),
        EMB: lambda r: est(r["k20.compressed.spearman_over_queries"]),
        L8: lambda r: est(r["k20.layer8.spearman_over_queries"]),
        CONTROL: lambda r: val(r["k20.control.spearman"])})
    outputs = row(records, "k20 outputs", {"k20": RT20}, SAME, {
        "measure": lambda r: f"KL; accuracy (dense {val(r['k20.dense.acc'], '.3f')}), k = 20",
        **{h: (lambda r, p=p: f"{val(r[f'{p}.kl'], '.3f')}; {val(r[f'{p}.acc'], '.3f')}") for h, p in paths.items()}})
    probes = {"g": flipped("G-state"), "l8": flipped("layer8")}
    probe = row(records, "k20 probe", probes, {
        "command": "`python research/flipped_labels.py --compressor DIR`", CONTROL: "—",
        "goal": "a section-2 prediction tested", "record": cite(records, PAGE, *probes.values())}, {
        "measure": lambda r: ("flipped-label probe, k = 20: loss change (dense "
                              f"{est(r['g.dense.loss_change'], '+.3f')})"),
        EMB: lambda r: est(r["g.compressed.loss_change"], "+.3f"),
        L8: lambda r: est(r["l8.compressed.loss_change"], "+.3f")})
    layers = {"layers": "ssm-input-rotten_tomatoes-k20-layers.json", "p1": flipped("layer1"), "p2": flipped("layer2")}
    depths = row(records, "k20 layers 1 and 2", layers, {
        "measure": "layers 1 / 2, k = 20: Spearman; minus control [paired CI]; probe loss change",
        "command": "`icl-ssm fidelity ... --also layer1=DIR layer2=DIR`; the probe", EMB: "—", CONTROL: "—",
        "goal": "same", "record": cite(records, PAGE, *layers.values())}, {
        L8: lambda r: ". ".join(
            f"{'layer' if n == 1 else 'Layer'} {n}: {val(r[f'layers.layer{n}.spearman'])}; "
            f"{est(r[f'layers.layer{n}_minus_control'], '+.2f')}; {est(r[f'p{n}.compressed.loss_change'], '+.3f')}"
            for n in (1, 2))})
    gflop = row(records, "k20 gflop", {"k20": RT20}, {
        "command": "`icl-ssm fidelity`", "goal": "<= half the dense", "record": cite(records, PAGE, RT20)}, {
        "measure": lambda r: f"GFLOP per evaluated subset, k = 20 (dense {val(r['k20.dense.gflop'], '.0f')})",
        **{h: (lambda r, p=p: val(r[f"{p}.gflop"], ".0f")) for h, p in paths.items()}})
    return [spearman, outputs, probe, depths, _products(records), gflop]


def _products(records: Records) -> Row:
    sources = {"pairs": "ssm-input-rotten_tomatoes-k20-products.json",
               "pairs512": "ssm-input-rotten_tomatoes-k20-products-512.json",
               "g": flipped("G-state"), "p": flipped("products"), "p512": flipped("products-512")}

    def products(r: Record, path: str, probe: str) -> str:
        return (f"{val(r[f'{path}.{path}.spearman'])}; {est(r[f'{path}.{path}_minus_control'], '+.2f')}; "
                f"{est(r[f'{probe}.compressed.loss_change'], '+.3f')}; {val(r[f'{probe}.state_separability'])}")

    return row(records, "k20 products", sources, {
        "command": "`icl-ssm fidelity ... --also pairs=DIR`; the probe", EMB: "—", CONTROL: "—", "goal": "same",
        "record": cite(records, "[products](docs/research/ssm-input.md#on-rotten-tomatoes-k--20)",
                       *sources.values())}, {
        "measure": lambda r: (
            "products of neighbouring tokens (`--pair-size 32 --pair-window 48`), k = 20: Spearman; minus control "
            f"[paired CI]; probe loss change; state separability (G: {val(r['g.state_separability'])})"),
        L8: lambda r: (
            f"{products(r, 'pairs', 'p')} (CPU, 1 thread). With 512 episodes: {products(r, 'pairs512', 'p512')}; "
            f"KL {val(r['pairs512.pairs512.kl'], '.3f')} (CPU, 2 threads)")})


def _k50(records: Records) -> list[Row]:
    paths = {EMB: "big.compressed", L8: "big.layer8", CONTROL: "big.control"}
    k50 = cite(records, PAGE, BIG)
    spearman = row(records, "k50 spearman", {"big": BIG}, {
        "command": "`icl-ssm fidelity ... --subsets 96 --queries 64`", "goal": "same", "record": k50}, {
        "measure": lambda r: (
            f"subset-loss Spearman vs dense, k = {r.config['sources']['big']['k']} (G128's recipe), "
            f"{held_out(r, 'big')} [95% CI over subsets]"),
        EMB: lambda r: est(r["big.compressed.spearman"]), L8: lambda r: est(r["big.layer8.spearman"]),
        CONTROL: lambda r: val(r["big.control.spearman"])})
    minus = row(records, "k50 minus control", {"big": BIG}, {
        "command": "same", CONTROL: "—", "goal": "excludes 0", "record": "same"}, {
        "measure": lambda r: (
            f"minus control, k = 50, {size(r, 'big')} [paired CI over subsets; over subsets and queries]"),
        EMB: lambda r: both(r, "big.compressed_minus_control"), L8: lambda r: both(r, "big.layer8_minus_control")})
    outputs = row(records, "k50 outputs", {"big": BIG}, SAME, {
        "measure": lambda r: (
            f"output MSE; KL; accuracy (dense {val(r['big.dense.acc'], '.3f')}), k = 50, {size(r, 'big')}"),
        **{h: (lambda r, p=p: f"{val(r[f'{p}.logit_mse'])}; {val(r[f'{p}.kl'], '.3f')}; {val(r[f'{p}.acc'], '.3f')}")
           for h, p in paths.items()}})
    cost = row(records, "k50 gflop", {"big": BIG}, {
        "command": "`icl-ssm fidelity ... --subsets 96 --queries 64`", "goal": "<= half the dense", "record": k50}, {
        "measure": lambda r: (
            f"GFLOP per evaluated subset, k = 50, {r.config['sources']['big']['queries']} queries, attention "
            f"counted (dense {val(r['big.dense.gflop'], ',.0f')})"),
        EMB: lambda r: gflop_share(r, "big.compressed", ",.0f"), L8: lambda r: gflop_share(r, "big.layer8", ",.0f"),
        CONTROL: lambda r: val(r["big.control.gflop"], ",.0f")})
    return [spearman, minus, outputs, *_coin_flip(records), cost]


def _depth(r: Record, src: str, path: str, joined: str, name: str, spread: bool = False) -> str:
    """``Spearman; minus control [paired CI]; output MSE; KL; GFLOP (share)`` of one path of source ``src``,
    its paired difference taken from the joined record ``joined`` (``name``: the path's name there)."""
    p = f"{src}.{path}"
    spearman = est(r[f"{p}.spearman"]) if spread else val(r[f"{p}.spearman"])
    return (f"{spearman}; {est(r[f'{joined}.{name}_minus_control'], '+.2f')}; {val(r[f'{p}.logit_mse'])}; "
            f"{val(r[f'{p}.kl'], '.3f')}; {gflop_share(r, p)}")


def _comparators(r: Record, src: str, window: bool = True) -> str:
    """The control's Spearman, output MSE and KL (and the window's Spearman)."""
    c = f"{src}.control"
    text = f"{val(r[f'{c}.spearman'])}; {val(r[f'{c}.logit_mse'])}; {val(r[f'{c}.kl'], '.3f')}"
    return text + (f" (window {val(r[f'{src}.window.spearman'])})" if window else "")


def _coin_flip(records: Records) -> list[Row]:
    """`coin_flip` at k = 20 and 50: every input depth against the control."""
    def depth20(r: Record, n: int) -> str:
        return (f"{val(r[f'c.layer{n}.spearman'])}; {est(r[f'c.layer{n}_minus_control'], '+.2f')}; "
                f"{val(r[f'c.layer{n}.logit_mse'])}")

    k20 = row(records, "coin_flip k20", {"c": "ssm-input-coin_flip-k20.json"}, {
        "command": "`icl-ssm fidelity --task coin_flip --k 20 ... --also layer1=DIR layer2=DIR layer8=DIR`",
        "goal": "excludes 0",
        "record": cite(records, "[coin_flip](docs/research/ssm-input.md#coin_flip-k--20-every-input-depth-against-"
                                "the-control)", "ssm-input-coin_flip-k20.json")}, {
        "measure": lambda r: (f"`coin_flip`, k = 20 (default recipe, {size(r, 'c')}): Spearman [95% CI]; minus "
                              "control [paired CI]; output MSE; KL"),
        EMB: lambda r: (f"{est(r['c.compressed.spearman'])}; {est(r['c.compressed_minus_control'], '+.2f')}; "
                        f"{val(r['c.compressed.logit_mse'])}; {val(r['c.compressed.kl'], '.3f')}"),
        L8: lambda r: (
            f"layer 1: {depth20(r, 1)}. Layer 2: {depth20(r, 2)}. Layer 8: {est(r['c.layer8.spearman'])}; "
            f"{est(r['c.layer8_minus_control'], '+.2f')}; {val(r['c.layer8.logit_mse'])}; "
            f"{val(r['c.layer8.kl'], '.3f')} ({val(r['c.layer8.flops_share'])}x the dense FLOPs)"),
        CONTROL: lambda r: _comparators(r, "c")})
    sources = {"a": "ssm-input-coin_flip-k50.json", "b": "ssm-input-coin_flip-k50-layers28.json",
               "j": "ssm-input-coin_flip-k50-joined.json"}  # j: the paired differences of every depth, one control
    k50 = row(records, "coin_flip k50", sources, {
        "command": "`icl-ssm fidelity --task coin_flip --k 50 ... --also layer1=DIR`; "
                   "`python research/join_reports.py`", "goal": "excludes 0",
        "record": cite(records, "[coin_flip k = 50](docs/research/ssm-input.md"
                                "#coin_flip-k--50-every-input-depth-against-the-control)", *sources.values())}, {
        "measure": lambda r: (
            f"`coin_flip`, k = 50 (default recipe, {size(r, 'a')}; dense split-half "
            f"{val(r['a.dense.split_half'])}): Spearman [95% CI]; minus control [paired CI over subsets]; output "
            f"MSE; KL; GFLOP per subset (dense {val(r['a.dense.gflop'], ',.0f')})"),
        EMB: lambda r: _depth(r, "a", "compressed", "j", "compressed", True),
        L8: lambda r: (f"layer 1: {_depth(r, 'a', 'layer1', 'j', 'layer1')}. Layer 2: "
                       f"{_depth(r, 'b', 'compressed', 'j', 'layer2')}. Layer 8: "
                       f"{_depth(r, 'b', 'layer8', 'j', 'layer8', True)}"),
        CONTROL: lambda r: _comparators(r, "a")})
    no_drift(k50.record, "j")
    return [k20, k50]


def _layers_k50(records: Records) -> Row:
    """Layers 1 and 2 at k = 50 on 64 x 64, joined with G128 and layer 8 on the same 64 subsets."""
    sources = {"l12": "ssm-input-rotten_tomatoes-k50-layers12-64x64.json",
               "j": "ssm-input-rotten_tomatoes-k50-joined-64x64.json"}
    # G128's and layer 8's Spearman on these 64 subsets: the control's plus their paired difference with it
    on64 = {f"on64_{p}": ("plus", ["l12.control.spearman", f"j.{p}_minus_control"]) for p in ("compressed", "layer8")}

    def n(r: Record) -> int:
        return r.config["sources"]["l12"]["subsets"]

    def depth(r: Record, path: str, name: str) -> str:
        p = f"l12.{path}"
        return (f"{est(r[f'{p}.spearman'])}; {both(r, f'j.{name}_minus_control')}; {val(r[f'{p}.logit_mse'])}; "
                f"{val(r[f'{p}.kl'], '.3f')}; {gflop_share(r, p)}")

    layers = row(records, "k50 layers 1 and 2", sources, {
        "command": "`icl-ssm fidelity ... --compressor layer1=DIR --also layer2=DIR --subsets 64`; "
                   "`python research/join_reports.py`", "goal": "excludes 0",
        "record": cite(records, "[layers 1 and 2](docs/research/ssm-input.md"
                                "#layers-1-and-2-at-k--50-trained-on-one-h100-evaluated-on-the-cpu)",
                       *sources.values())}, {
        "measure": lambda r: (
            f"layers 1 / 2, k = 50, {size(r, 'l12')} (the first {n(r)} of the 96 subsets; trained on one H100): "
            "Spearman [95% CI]; minus control [paired CI over subsets; and queries]; output MSE; KL; GFLOP per "
            "subset"),
        EMB: lambda r: f"on these {n(r)}: {val(r['on64_compressed'])}; {both(r, 'j.compressed_minus_control')}",
        L8: lambda r: (f"layer 1: {depth(r, 'compressed', 'layer1')}. Layer 2: {depth(r, 'layer2', 'layer2')}. "
                       f"Layer 8 on these {n(r)}: {val(r['on64_layer8'])}; "
                       f"{val(r['j.layer8_minus_control'], '+.2f')}"),
        CONTROL: lambda r: _comparators(r, "l12", window=False)}, on64)
    no_drift(layers.record, "j")
    return layers


def ssm_reads(records: Records) -> str:
    """BENCHMARKS' 'What the SSM reads, on a language task'."""
    return render_rows([*_k20(records), *_k50(records), _layers_k50(records)], HEADERS)
