"""BENCHMARKS' 'Synthetic in-context regression': selection, fidelity and the probe on the synthetic task.

Reads, through the one adapter (:mod:`.readers.synthetic`), the ``icl-ssm synthetic select`` records of the
linear teacher at k = 20 and k = 5-60 and of the ReLU teacher, the ReLU teacher's evaluation, the ``synthetic
fidelity`` records of the products and embeddings caches and the flipped-target probe. Each row of the table
is the records it reads joined (:func:`row`, by :func:`~.readers.common.combined`), rendered by the one renderer;
the statistics (means and sds over seeds, the k from which a statement holds, ranges over k) are the readers'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from icl_ssm.records import Record

from .adapt import read
from .base import Records, cite
from .readers.common import combined
from .render import FORMATS, Column, metric_text, render

__all__ = ["synthetic", "row", "part"]

K20, K60 = "synthetic-products-select-k20.json", "synthetic-products-select-k5-60.json"
RELU = ("synthetic-teacher-relu-60-evaluation.json", "synthetic-relu-select-k5-60.json",
        "synthetic-relu-fidelity-k20-40-60.json")
FIDELITY = ("synthetic-products-fidelity-q64.json", "synthetic-products-fidelity-q16.json",
            "synthetic-embeddings-c16-v8-fidelity-q64.json")
PROBE = "synthetic-products-probe.json"
PRODUCTS = "[products](docs/research/ssm-input.md#products-of-neighbouring-tokens)"
SYNTHETIC = "docs/research/synthetic-regression.md"
HEADERS = ["measure", "command", "measured", "goal", "record"]


def row(kind: str, **parts: Record) -> Record:
    """One row of the table: the records it reads joined by :func:`~.readers.common.combined`, each as the part
    named by its keyword (its metrics ``part.X``, read back with :func:`part`); settings: the row's ``kind``
    (``row``, a key of :data:`CELLS`) and the records' names (``records``, its record column's links)."""
    return combined(kind, parts, config={"row": kind, "records": [r.name for r in parts.values()]})


def part(joined: Record, name: str) -> Record:
    """The record joined into ``joined`` as ``name`` (:func:`row`), with its own config."""
    return replace(joined.part(name), config=joined.config["sources"][name])


def _mse(r: Record, k: int, method: str) -> str:
    """Mean test MSE over seeds ± its sample sd."""
    return f"{r[f'k{k}.{method}.mse'].value:.3f} ± {r[f'k{k}.{method}.mse_sd'].value:.3f}"


def _signed2(x: float) -> str:
    return f"{x:+.2f}"


def _mean(r: Record, k: int, method: str) -> str:
    return f"{r[f'k{k}.{method}.mse'].value:.3f}"


def _seeds(r: Record, k: int) -> int:
    return r[f"k{k}.random.mse"].n


def _k20(r: Record) -> list[str]:
    sel = part(r, "select")
    gap = sel["k20.gap"].value
    m = {method: sel[f"k20.{method}.mse"].value for method in ("random", "topk", "affinity-dense",
                                                               "affinity-compressed")}
    met = gap <= sel.config["within"] and max(m["affinity-dense"], m["affinity-compressed"]) < min(m["random"],
                                                                                                   m["topk"])
    return [f"test MSE, k = 20, {_seeds(sel, 20)} seeds ({sel.config['subsets']} subsets x {sel.config['queries']} "
            "validation queries each)",
            "`icl-ssm synthetic select --teacher T --compressor C --k 20 --seeds 0 1 2 3 4 --out O`",
            f"affinity dense {_mse(sel, 20, 'affinity-dense')}; **products {_mse(sel, 20, 'affinity-compressed')}** "
            f"(within {gap:.0%}); random {_mse(sel, 20, 'random')}, top-k {_mse(sel, 20, 'topk')}",
            f"compressed within 10% of dense, both below random and top-k: **{'met' if met else 'not met'}**",
            f"{PRODUCTS}, [synthetic]({SYNTHETIC}"
            "#compressors-for-the-linear-teacher-and-selection-with-them-2026-11-26)"]


def _d1(r: Record) -> list[str]:
    sel = part(r, "select")
    dense, comp = sel["k20.affinity-dense.d1_share"].value, sel["k20.affinity-compressed.d1_share"].value
    return [f"D1 share of the pick, k = 20, {_seeds(sel, 20)} seeds", "same",
            f"dense {dense:.2f}, products {comp:.2f} (pool {sel['pool_d1_share'].value:.2f})",
            f"compressed >= 0.90: {'met' if comp >= 0.9 else 'not met'}"
            + (", and out of reach of mean-loss affinity itself (the dense evaluator's share)" if dense < 0.9 else ""),
            "same"]


def _k60(r: Record) -> list[str]:
    """Test MSE against k on the 60-pair linear teacher, one products compressor trained at k = 40."""
    sel = part(r, "select")
    ks, within = sel.config["ks"], sel.config["within"]
    top, below, close = ks[-1], sel["below_from"].value, sel["close_from"].value
    gap = {k: sel[f"k{k}.gap"].value for k in ks}
    at = lambda k: f"{_mean(sel, k, 'affinity-compressed')} against {_mean(sel, k, 'affinity-dense')}"  # noqa: E731
    behind = [k for k in ks if k < close and gap[k] > within]
    ahead = [k for k in ks if gap[k] < 0]
    return [
        f"test MSE against k ({ks[0]}-{top}, {_seeds(sel, ks[0])} seeds), a teacher trained on up to {top} pairs, "
        "one products compressor trained at k = 40",
        "`icl-ssm synthetic train --max-pairs 60 ...`, `synthetic distill ... --k 40`, "
        "`synthetic select ... --k 5 10 20 30 40 50 60`",
        f"[plot](docs/figures/synthetic-linear-select-k60.png): both affinity evaluators below random and top-k from "
        f"k = {below} on; compressed within {sel['close_gap_max'].value:.0%} of dense only from k = {close} ("
        + "; ".join(f"k = {k}: {at(k)}" for k in ks if k >= close)
        + f"; random {_mean(sel, top, 'random')}, top-k {_mean(sel, top, 'topk')}), "
        + ", ".join(f"{gap[k]:.0%} behind at k = {k}" + (f" ({at(k)})" if k == behind[-1] else "")
                    for k in reversed(behind) if k >= below)
        + (f", ahead of it at k = {' and '.join(map(str, ahead))}" if ahead else ""),
        "the paper's figure",
        f"[k up to 60]({SYNTHETIC}#a-teacher-for-k-up-to-60-and-the-selection-study-from-k--5-to-60)"]


def _relu(r: Record) -> list[str]:
    """ReLU functions: a teacher carried from the linear one, test MSE against k, fidelity at 20, 40, 60."""
    teacher, sel, fid = part(r, "teacher"), part(r, "select"), part(r, "fidelity")
    ks, fks = sel.config["ks"], fid.config["ks"]
    top = ks[-1]
    wins = [k for k in ks if sel[f"k{k}.topk_minus_dense"].value < 0]
    ranks = " / ".join(FORMATS["rho"](fid[f"k{k}.compressed.spearman"].value) for k in fks)
    spread = lambda key, fmt: f"{fmt(fid[f'{key}_min'].value)} to {fmt(fid[f'{key}_max'].value)}"  # noqa: E731
    return [
        f"ReLU functions: test MSE against k ({ks[0]}-{top}, {_seeds(sel, top)} seeds), a teacher carried from the "
        f"60-pair linear one (`--init-from`, 3,000 steps: {teacher['k40.teacher'].value:.2f} at k = 40, zero "
        f"{teacher['k40.zero'].value:.2f})",
        "`icl-ssm synthetic train --function relu --init-from T ...`, then `distill`, `select` as for linear",
        f"[plot](docs/figures/synthetic-relu-select-k60.png): compressed more than {sel.config['margin']} below random "
        f"from k = {sel['below_random_from'].value} and below top-k from k = {sel['below_topk_from'].value} (k = "
        f"{top}: {_mse(sel, top, 'affinity-compressed')}; top-k {_mean(sel, top, 'topk')}, random "
        f"{_mean(sel, top, 'random')}, dense {_mean(sel, top, 'affinity-dense')}); top-k beats the dense evaluator "
        f"at k = {', '.join(map(str, wins[:-1]))} and {wins[-1]} (near inputs inform a nonlinear function); "
        f"Spearman {ranks} at k = {' / '.join(map(str, fks))}, above the control "
        f"({spread('control_spearman', FORMATS['rho'])}) by {spread('compressed_minus_control', _signed2)}",
        "the paper's ReLU figure",
        f"[ReLU]({SYNTHETIC}#a-relu-teacher-carried-from-the-linear-one-and-the-relu-figure)"]


def _fidelity(r: Record) -> list[str]:
    """The k = 20 products cache's ranking at 64 and 16 queries, beside the embeddings cache."""
    q64, q16, emb = part(r, "q64"), part(r, "q16"), part(r, "embeddings")
    sp = lambda x: metric_text(x["compressed.spearman"], FORMATS["rho"])  # noqa: E731
    over = lambda pair: metric_text(q64[pair], _signed2)  # noqa: E731
    rho = lambda x, path: FORMATS["rho"](x[f"{path}.spearman"].value)  # noqa: E731
    met = q64["compressed.spearman"].value >= 0.8 and q64["compressed_minus_control"].interval[0] > 0
    return [f"subset-loss Spearman vs dense, {q64.config['subsets']} held-out subsets x {q64.config['queries']} "
            "queries",
            "`icl-ssm synthetic fidelity --teacher T --compressor C --control CC`",
            f"**products {sp(q64)}, minus control {over('compressed_minus_control')}**, minus window "
            f"{over('compressed_minus_window')}; embeddings (same training) {sp(emb)}; control "
            f"{rho(q64, 'control')}; window {rho(q64, 'window')}. At {q16.config['queries']} queries (what "
            f"selection uses): products {sp(q16)}, control {rho(q16, 'control')}, window {rho(q16, 'window')}; "
            "intervals resample the subsets",
            ">= 0.8, above control by a paired interval: "
            + (f"**met** (products, at {q64.config['queries']} queries)" if met else "**not met**"),
            PRODUCTS]


def _flops(r: Record) -> list[str]:
    q64, q16, emb = part(r, "q64"), part(r, "q16"), part(r, "embeddings")
    ratio = q16["flop_ratio"].value
    return ["FLOPs per evaluated subset, dense / compressed, attention counted", "same",
            f"whole evaluation with {q16.config['queries']} queries: {FORMATS['ratio'](ratio)} fewer (products); "
            f"the cache build alone: {FORMATS['ratio'](q64['cache_flop_ratio'].value)} (products), "
            f"{FORMATS['ratio'](emb['cache_flop_ratio'].value)} (embeddings)",
            ">= 10x: " + ("met" if ratio >= 10 else "not met"), "same"]


def _probe(r: Record) -> list[str]:
    """The flipped-target probe: how much the loss rises when the targets are another cluster's."""
    probe = part(r, "probe")
    rise = lambda path: (metric_text(probe[f"{path}.rise"], lambda x: f"{x:+.3f}")  # noqa: E731
                         + f", {probe[f'{path}.higher_share'].value:.0%}")
    confirmed = probe["compressed.rise"].interval[0] > 0 and probe["dense.rise"].interval[0] > 0
    return [f"flipped-target probe: loss rise when every target is another cluster's ({probe.config['pairs']} pairs)",
            "`icl-ssm synthetic probe --teacher T --compressor C`",
            f"dense {rise('dense')} of pairs; **products {rise('compressed')}**",
            "a section-2 prediction tested: " + ("**confirmed**" if confirmed else "not confirmed"),
            PRODUCTS]


# a row's kind -> its cells: measure, command, measured, goal, and the pages its record column links ("same")
CELLS: dict[str, Callable[[Record], list[str]]] = {
    "k20": _k20, "d1": _d1, "k60": _k60, "relu": _relu, "fidelity": _fidelity, "flops": _flops, "probe": _probe}


def _columns(records: Records) -> list[Column]:
    def cell(i: int) -> Callable[[Record], str]:
        return lambda r: CELLS[r.config["row"]](r)[i]

    def record(r: Record) -> str:
        pages = CELLS[r.config["row"]](r)[-1]
        return pages if pages == "same" else cite(records, pages, *r.config["records"])

    return [*(Column(header, cell=cell(i)) for i, header in enumerate(HEADERS[:-1])), Column("record", cell=record)]


def synthetic(records: Records) -> str:
    """BENCHMARKS' 'Synthetic in-context regression' (the one renderer, over the records read through the
    one adapter)."""
    k20 = read(records, K20)
    teacher, relu, relu_fidelity = (read(records, n) for n in RELU)
    q64, q16, emb = (read(records, n) for n in FIDELITY)
    rows = [row("k20", select=k20), row("d1", select=k20), row("k60", select=read(records, K60)),
            row("relu", teacher=teacher, select=relu, fidelity=relu_fidelity),
            row("fidelity", q64=q64, q16=q16, embeddings=emb), row("flops", q64=q64, q16=q16, embeddings=emb),
            row("probe", probe=read(records, PROBE))]
    return render(rows, _columns(records))
