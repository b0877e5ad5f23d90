"""``icl-ssm fidelity`` reports and the research records built on them.

Families: the fidelity reports (``ablation-``, ``gpu-``, ``k50-``, ``seeds-``, ``ssm-input-``: one
:func:`fidelity_report` each; an ``ssm-input-...-joined`` record of ``research/join_reports.py`` by
:func:`joined_report`), the exact windows of ``research/recency.py`` (``recency-``, :func:`recency`), the
tail-readout probe (``tail-readout-``, :func:`tail_readout`) and the flipped-label probe (``flipped-``,
:func:`flipped`). A path's numbers are named as in :func:`path_metrics`; a paired difference of Spearmans
between two paths as ``{a}_minus_{b}`` (interval over subsets) and ``{a}_minus_{b}_over_queries``.
"""

from __future__ import annotations

import re
from typing import Any

from icl_ssm.records import Metric, Record

from .common import accuracy

COMPARATORS = ("control", "window")  # the stored paths besides the compressed cache, keys prefixed "control_"


def _interval(pair: list | None) -> tuple[float, float] | None:
    """A stored interval, None where it is absent or was not finite (stored as None)."""
    return None if not pair or None in pair else (pair[0], pair[1])


def _spearman(value: float | None, pair: list | None, n: int | None, resamples: str,
              unit: str = "spearman") -> Metric:
    interval = _interval(pair)
    return Metric(value, interval, n, resamples if interval else None, unit)


def path_metrics(prefix: str, block: dict[str, Any], subsets: int | None, queries: int | None,
                 dense_flops: float | None) -> dict[str, Metric]:
    """One path's numbers (``block``: ``subset_loss_spearman``, its ``_ci95``/``_ci95_queries``, ``kl``, ``acc``,
    ``flops``, ...) as ``{prefix}.X``: ``spearman`` (subset-loss Spearman with dense, its 95% interval resampling
    the subsets, n = subsets), ``spearman_over_queries`` (the same value, its interval resampling subsets and
    queries), ``spearman_balanced`` (label-balanced subset losses, interval over subsets and queries),
    ``spearman_pooled`` (the label-balanced Spearman where stored, else the plain one, as
    ``research/ablation_pooled.py`` pools it), ``kl`` (nats), ``rel_logit_err`` (a share), ``logit_mse``,
    ``acc`` (accuracy over subsets x queries answers), ``gflop`` (GFLOP per evaluated subset) and
    ``flops_share`` (its FLOPs over the dense pass's). A key the block lacks gives no metric."""
    out: dict[str, Metric] = {}
    rho = block.get("subset_loss_spearman")
    if rho is not None:
        out["spearman"] = _spearman(rho, block.get("subset_loss_spearman_ci95"), subsets, "subsets")
        if "subset_loss_spearman_ci95_queries" in block:
            out["spearman_over_queries"] = _spearman(rho, block["subset_loss_spearman_ci95_queries"], subsets,
                                                     "subsets and queries")
        balanced = block.get("subset_loss_spearman_balanced")
        if balanced is not None:
            out["spearman_balanced"] = _spearman(balanced, block.get("subset_loss_spearman_balanced_ci95_queries"),
                                                 subsets, "subsets and queries")
        out["spearman_pooled"] = Metric(balanced or rho, n=subsets, unit="spearman (label-balanced where stored)")
    units = {"kl": "nats", "rel_logit_err": "share", "logit_mse": "output MSE"}
    out |= {key: Metric(block[key], n=subsets, unit=unit) for key, unit in units.items() if block.get(key) is not None}
    answers = subsets * queries if subsets and queries else None
    if block.get("acc") is not None:
        out["acc"] = accuracy(block["acc"], answers)
    if block.get("flops") is not None:
        out["gflop"] = Metric(block["flops"] / 1e9, unit="GFLOP per subset")
        if dense_flops:
            out["flops_share"] = Metric(block["flops"] / 1e9 / (dense_flops / 1e9), unit="x the dense FLOPs")
    return {f"{prefix}.{k}": m for k, m in out.items()}


def _as_compressed(block: dict[str, Any]) -> dict[str, Any]:
    """A report's (or a research record's) unprefixed keys as a path block: ``acc_compressed`` as ``acc``,
    ``flops_compressed`` as ``flops``."""
    return {**block, "acc": block.get("acc_compressed"), "flops": block.get("flops_compressed")}


def paired_metrics(paired: dict[str, dict], subsets: int | None) -> dict[str, Metric]:
    """Stored paired Spearman differences ``{"a-b": {"diff", "ci95", "ci95_queries"}}`` as ``a_minus_b``
    (interval resampling subsets, n = subsets) and ``a_minus_b_over_queries`` (subsets and queries)."""
    out = {}
    for pair, d in paired.items():
        a, b = pair.rsplit("-", 1)
        for key, what, suffix in (("ci95", "subsets", ""), ("ci95_queries", "subsets and queries", "_over_queries")):
            if key in d:
                out[f"{a}_minus_{b}{suffix}"] = _spearman(d["diff"], d[key], subsets, what, "spearman difference")
    return out


def _config(raw: dict[str, Any]) -> dict[str, Any]:
    keys = ("model", "task", "k", "subsets", "queries", "seed", "loss", "prompt_tokens_mean", "num_virtual")
    return {k: raw[k] for k in keys if k in raw} | {"command": (raw.get("provenance") or {}).get("command")}


def fidelity_report(raw: dict[str, Any], name: str) -> Record:
    """One ``icl-ssm fidelity --json`` report: per path (``compressed``, ``control``, ``window`` and each
    ``--also`` name) :func:`path_metrics`; ``dense.acc``, ``dense.gflop`` and ``dense.split_half`` (the dense
    losses' split-half Spearman); the paired differences (:func:`paired_metrics`). Config: the report's ``model``,
    ``task``, ``k``, ``subsets``, ``queries``, ``seed``, ``loss``, ``prompt_tokens_mean``, ``num_virtual`` (the
    compressed cache's virtual tokens) where stored, its ``command`` and ``paths``. A joined record
    (``research/join_reports.py``, no paths of its own) is read by :func:`joined_report`."""
    if "acc_compressed" not in raw and "paired" in raw:
        return joined_report(raw, name)
    subsets, queries, dense_flops = raw.get("subsets"), raw.get("queries"), raw.get("flops_dense")
    blocks = {"compressed": _as_compressed(raw)}
    for path in COMPARATORS:
        start = f"{path}_"
        if f"{start}subset_loss_spearman" in raw:
            blocks[path] = {k[len(start):]: v for k, v in raw.items() if k.startswith(start)}
    blocks |= raw.get("also") or {}
    metrics: dict[str, Metric] = {}
    for path, block in blocks.items():
        metrics |= path_metrics(path, block, subsets, queries, dense_flops)
    metrics |= {"dense.acc": accuracy(raw.get("acc_dense"), subsets * queries if subsets and queries else None),
                "dense.gflop": Metric(None if dense_flops is None else dense_flops / 1e9, unit="GFLOP per subset"),
                "dense.split_half": Metric(raw.get("dense_split_half_spearman"), n=subsets, unit="spearman")}
    metrics |= paired_metrics(raw.get("paired") or {}, subsets)
    ids = (raw.get("per_subset") or {}).get("ids") or []
    return Record({"process": raw.get("provenance")}, _config(raw) | {"paths": list(blocks)}, metrics,
                  {"subsets": [",".join(map(str, s)) for s in ids]}, name)


def joined_report(raw: dict[str, Any], name: str) -> Record:
    """Two fidelity reports joined on the subsets both hold (``research/join_reports.py``): the paired
    differences (:func:`paired_metrics`) and ``drift.dense`` / ``drift.control`` / ``drift.window``, the
    largest difference between the two runs' losses of that path (0: the runs agree)."""
    subsets = raw.get("subsets")
    drift = {f"drift.{p}": Metric(v, unit="loss") for p, v in (raw.get("drift") or {}).items()}
    return Record({"process": raw.get("provenance")}, _config(raw), paired_metrics(raw["paired"], subsets) | drift,
                  {}, name)


def exact_share(raw: dict[str, Any], spearman: float = 0.8, kl: float = 0.02) -> tuple[float, float]:
    """The prompt shares of the largest exact window of a ``research/recency.py`` record that misses the
    Spearman or KL target and of the smallest that meets both (its tokens over the mean prompt's)."""
    tokens = {}
    for r in raw["rows"]:
        m = re.search(r"last (\d+) tokens", r["cache"])
        if m:
            tokens[m.group(1)] = r["tokens"]
    share = {int(w): tokens[w] / raw["prompt_tokens_mean"] for w in raw["windows"]}
    meets = {int(w): v["subset_loss_spearman"] >= spearman and v["kl"] <= kl for w, v in raw["windows"].items()}
    first = min(w for w, ok in meets.items() if ok)
    miss = max(w for w, ok in meets.items() if not ok and w < first)
    return share[miss], share[first]


def recency(raw: dict[str, Any], name: str) -> Record:
    """The exact windows of ``research/recency.py`` (the sinks + the last n prompt tokens): per window n,
    :func:`path_metrics` as ``last{n}.X`` and ``last{n}.share`` (its tokens over the mean prompt's); ``best.X``:
    the window of the lowest relative logit error (``best.rel_logit_err``, ``best.share``; n in config
    ``best``); ``exact.miss`` / ``exact.meets``: the prompt shares of the largest window missing Spearman 0.8
    or KL 0.02 and of the smallest meeting both (:func:`exact_share`)."""
    subsets, queries, mean = raw.get("subsets"), raw.get("queries"), raw["prompt_tokens_mean"]
    tokens = {m.group(1): r["tokens"] for r in raw["rows"] if (m := re.search(r"last (\d+) tokens$", r["cache"]))}
    metrics: dict[str, Metric] = {}
    for n, block in raw["windows"].items():
        metrics |= path_metrics(f"last{n}", _as_compressed(block), subsets, queries, block.get("flops_dense"))
        if n in tokens:
            metrics[f"last{n}.share"] = Metric(tokens[n] / mean, unit="share of the prompt")
    best = min(raw["windows"], key=lambda w: raw["windows"][w]["rel_logit_err"])
    metrics |= {"best.rel_logit_err": metrics[f"last{best}.rel_logit_err"], "best.share": metrics[f"last{best}.share"]}
    miss, meets = exact_share(raw)
    metrics |= {"exact.miss": Metric(miss, unit="share of the prompt"),
                "exact.meets": Metric(meets, unit="share of the prompt")}
    config = {k: raw.get(k) for k in ("task", "k", "subsets", "queries", "report")}
    return Record({"process": raw.get("provenance")}, config | {"best": best, "windows": list(raw["windows"])},
                  metrics, {}, name)


def tail_readout(raw: dict[str, Any], name: str) -> Record:
    """``research/tail_readout.py``: per run (``R4``, ``C4``, ``C4s1``, ...) the read-out's numbers as
    :func:`path_metrics` ``{run}.X`` and the dense tail's as ``{run}-dense-tail.X``."""
    metrics: dict[str, Metric] = {}
    for run, r in raw["runs"].items():
        for key, prefix in (("readout", run), ("dense_tail", f"{run}-dense-tail")):
            block = r.get(key)
            if block:
                metrics |= path_metrics(prefix, _as_compressed(block), None, None, block.get("flops_dense"))
    return Record({"process": raw.get("provenance")}, {"report": raw.get("report"), "runs": list(raw["runs"])},
                  metrics, {}, name)


def flipped(raw: dict[str, Any], name: str) -> Record:
    """``research/flipped_labels.py``: per path (``dense``, ``compressed``, ``control`` where run)
    ``{path}.loss_change`` (mean loss with flipped labels minus with the right ones, its 95% interval
    resampling the subsets, n = subsets) and ``{path}.higher_share`` (the share of subsets whose loss rises);
    ``state_separability`` (held-out accuracy of a linear read-out telling the two states apart, a Wilson
    interval over its 2 x pairs held-out predictions)."""
    subsets = raw.get("subsets")
    metrics: dict[str, Metric] = {}
    for path in ("dense", "compressed", "control"):
        p = raw.get(path)
        if isinstance(p, dict):  # an older record names its control's directory under "control"
            metrics[f"{path}.loss_change"] = _spearman(p["diff"], p.get("ci95"), subsets, "subsets", "loss")
            metrics[f"{path}.higher_share"] = Metric(p.get("higher_share"), n=subsets, unit="share of subsets")
    sep = raw.get("state_separability")
    if sep:
        metrics["state_separability"] = _spearman(sep["accuracy"], sep.get("ci95"), 2 * sep["pairs"],
                                                  "held-out predictions (Wilson interval)", "accuracy")
    config = {k: raw.get(k) for k in ("model", "task", "k", "subsets", "queries")}
    return Record({"process": raw.get("provenance")}, config, metrics, {}, name)


FAMILIES = {start: fidelity_report for start in ("ablation-", "gpu-", "k50-", "seeds-", "ssm-input-")} | {
    "recency-": recency, "tail-readout-": tail_readout, "flipped-": flipped}
