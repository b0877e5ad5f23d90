"""``icl-ssm bench long-context``: the paper's table of the compressed cache against long-context
methods, per task and shot count: relative answer-logit error, KL, accuracy, the subset-loss
Spearman against the dense prompt (with its interval), FLOPs per subset and the cache's size.

Each (task, k) is one :func:`icl_ssm.evaluate.fidelity.run_fidelity` with the StreamingLLM and
LM-Infinite paths (:data:`icl_ssm.evaluate.paths.BASELINES`) beside the compressor, its
control when given, and the untrained window, all at the compressor's cache size. The cache's
memory is its K/V bytes per prompt: slots x layers x 2 x KV heads x head size x the element
size (float32 on the CPU).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from icl_ssm import atomic
from icl_ssm.compress.compressor import SSMCompressorConfig, head_dim, kv_heads
from icl_ssm.compress.pretrained import find_pretrained
from icl_ssm.evaluate.fidelity import FidelityConfig, run_fidelity
from icl_ssm.evaluate.paths import BASELINES

PATHS = ("dense", "compressed", "control", "window", "streaming", "lm-infinite")


def cache_bytes(slots: float, config, element: int = 4) -> float:
    """K/V bytes of a cache of ``slots`` positions on every layer of the model ``config``."""
    return slots * config.num_hidden_layers * 2 * kv_heads(config) * head_dim(config) * element


def teacher_shape(compressor_dir: str) -> SimpleNamespace:
    """The teacher's cache shape as its compressor's saved config records it (no model load)."""
    c = SSMCompressorConfig.from_pretrained(compressor_dir)
    return SimpleNamespace(num_hidden_layers=c.teacher_num_layers, num_key_value_heads=c.teacher_num_kv_heads,
                           head_dim=c.teacher_head_dim)


def rows_of(report: dict[str, Any], model_config) -> list[dict[str, Any]]:
    """One row per path of a fidelity report (dense first; paths the report lacks are skipped)."""
    sinks = report["num_sink"]
    window_slots = sinks + report["n_window"]
    rows = [{"path": "dense", "slots": report["prompt_tokens_mean"], "rel_logit_err": 0.0, "kl": 0.0,
             "acc": report["acc_dense"], "spearman": 1.0, "spearman_ci95": [1.0, 1.0],
             "flops": report["flops_dense"]}]
    rows.append({"path": "compressed", "slots": report["cache_tokens"], "rel_logit_err": report["rel_logit_err"],
                 "kl": report["kl"], "acc": report["acc_compressed"], "spearman": report["subset_loss_spearman"],
                 "spearman_ci95": report["subset_loss_spearman_ci95_queries"], "flops": report["flops_compressed"]})
    for name in ("control", "window", "streaming", "lm-infinite"):
        if f"{name}_kl" not in report:
            continue
        rows.append({"path": name, "slots": report["cache_tokens"] if name == "control" else window_slots,
                     "rel_logit_err": report[f"{name}_rel_logit_err"], "kl": report[f"{name}_kl"],
                     "acc": report[f"{name}_acc"], "spearman": report[f"{name}_subset_loss_spearman"],
                     "spearman_ci95": report[f"{name}_subset_loss_spearman_ci95_queries"],
                     "flops": report[f"{name}_flops"]})
    for row in rows:
        row["cache_mib"] = cache_bytes(row["slots"], model_config) / 2**20
        row["flops_vs_dense"] = row["flops"] / report["flops_dense"]
    return rows


def run_long_context(tasks: Sequence[str], ks: Sequence[int], out: str | Path, *, base: FidelityConfig,
                     compressors: dict[str, str] | None = None, controls: dict[str, str] | None = None,
                     say=print) -> dict[str, Any]:
    """Every (task, k) into ``out/<task>-k<k>.json`` (read back when present), the table into
    ``out/long_context.json``, ``.md`` and ``.png``. ``compressors``: task -> directory; a task
    without one takes the compressor shipped for it at the shot count nearest ``k``."""
    out = atomic.prepare_dir(out)
    compressors, controls = compressors or {}, controls or {}
    results = []
    for task in tasks:
        for k in ks:
            path = out / f"{Path(task).stem}-k{k}.json"
            if path.exists():
                report = json.loads(path.read_text())
            else:
                comp = compressors.get(task)
                if comp is None:
                    shipped = find_pretrained(base.model, task, k)
                    if shipped is None:
                        raise ValueError(f"no compressor for task {task!r}: none is shipped for --model {base.model}; "
                                         f"give one with --compressor {task}=DIR")
                    comp = str(shipped / "compressor")
                cfg = replace(base, task=task, k=k, compressor=comp, control=controls.get(task),
                              baselines=BASELINES)
                report = run_fidelity(cfg)
                atomic.write_json(path, report)
            rows = rows_of(report, teacher_shape(report["config"]["compressor"]))
            results.append({"task": report["task"], "k": k, "subsets": report["subsets"], "queries": report["queries"],
                            "compressor": report["config"]["compressor"], "prompt_tokens": report["prompt_tokens_mean"],
                            "rows": rows})
            say(f"{report['task']} k={k}: " + ", ".join(
                f"{r['path']} Spearman {_f(r['spearman'], '.2f')}, KL {_f(r['kl'], '.3f')}" for r in rows[1:]))
    table = {"model": base.model, "subsets": base.subsets, "queries": base.queries, "results": results}
    atomic.write_json(out / "long_context.json", table)
    atomic.write_text(out / "long_context.md", long_context_markdown(table))
    plot_long_context(table, out / "long_context.png")
    return table


def _f(v, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def long_context_markdown(table: dict[str, Any]) -> str:
    lines = []
    for res in table["results"]:
        lines += [f"**{res['task']}, k = {res['k']}** ({res['prompt_tokens']:.0f} prompt tokens; {res['subsets']} "
                  f"subsets x {res['queries']} queries)", "",
                  "| path | cache slots | cache MiB | rel. logit error | KL | accuracy | subset-loss Spearman [95%] "
                  "| GFLOP / subset | FLOPs vs dense |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in res["rows"]:
            lo, hi = r["spearman_ci95"] or (None, None)
            lines.append(f"| {r['path']} | {r['slots']:.0f} | {r['cache_mib']:.2f} | {_f(r['rel_logit_err'], '.3f')} | "
                         f"{_f(r['kl'], '.3f')} | {_f(r['acc'], '.3f')} | {_f(r['spearman'], '.2f')} "
                         f"[{_f(lo, '.2f')}, {_f(hi, '.2f')}] | {r['flops'] / 1e9:.1f} | {r['flops_vs_dense']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def plot_long_context(table: dict[str, Any], path: str | Path) -> None:
    """Two panels per (task, k): subset-loss Spearman with its interval, and KL, per path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = table["results"]
    fig, axes = plt.subplots(2, len(results), figsize=(4.2 * len(results), 6.4), squeeze=False)
    for col, res in enumerate(results):
        rows = [r for r in res["rows"] if r["path"] != "dense"]
        names = [r["path"] for r in rows]
        rho, low, high = [], [], []
        for r in rows:  # a constant side (a control's losses) has no Spearman: drawn empty
            x = float("nan") if r["spearman"] is None else r["spearman"]
            lo, hi = r["spearman_ci95"] or (None, None)
            rho.append(x)
            low.append(0.0 if lo is None or x != x else max(0.0, x - lo))
            high.append(0.0 if hi is None or x != x else max(0.0, hi - x))
        err = [low, high]
        ax = axes[0, col]
        ax.bar(names, rho, yerr=err, capsize=3, color="tab:blue")
        ax.axhline(0, color="black", lw=0.5)
        ax.set_ylim(-1, 1)
        ax.set_title(f"{res['task']}, k = {res['k']}")
        ax.set_ylabel("subset-loss Spearman vs dense")
        ax = axes[1, col]
        ax.bar(names, [r["kl"] for r in rows], color="tab:orange")
        ax.set_ylabel("KL to the dense answers (nats)")
        for a in axes[:, col]:
            a.tick_params(axis="x", rotation=30)
    fig.suptitle(f"{table['model']}: compressed cache against long-context methods at the same cache size")
    fig.tight_layout()
    atomic.write_with(Path(path), lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
