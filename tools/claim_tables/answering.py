"""BENCHMARKS' 'Answering with a chosen prompt': one row per ``answer-throughput-*.json`` record that
``icl-ssm bench answer`` writes (answers per second and memory with the prefix shared exactly, compressed, or
re-encoded per input, and how far the paths agree), read through the one adapter (``readers/answering.py``) and
rendered by the one renderer."""

from __future__ import annotations

from collections.abc import Callable

from icl_ssm.records import Record

from .adapt import as_record
from .base import Records
from .render import FORMATS, Column, metric_text, render


def _ran(r: Record, path: str) -> bool:
    return f"{path}.answers_per_second" in r.metrics


def _prompt(r: Record) -> str:
    c = r.config
    model = f"{c['shape']} shape, random weights" if c.get("shape") else c["model"]
    path = "shared-exact" if _ran(r, "shared-exact") else "reencode"
    return f"{model}, {c['task']}, k = {c['k']} ({r[f'{path}.prompt_tokens'].value} tokens)"


def _rate(path: str) -> Callable[[Record], str]:
    """Answers per second (times re-encoding's, but for re-encoding itself) and peak memory of one path."""
    def cell(r: Record) -> str:
        if not _ran(r, path):
            return "—"
        x = r[f"{path}.x_reencode"].value
        times = f" ({x:.1f}x)" if x is not None and path != "reencode" else ""
        text = f"{r[f'{path}.answers_per_second'].value:.2f}{times}, {r[f'{path}.peak_rss_mib'].value:,.0f} MiB"
        return text + (f" ({r[f'{path}.inputs'].value:,} inputs)" if path == "reencode" else "")
    return cell


def _identity(r: Record) -> str:
    if "exact_vs_reencode.identical_answers" not in r.metrics:
        return "—"
    text = f"{r['exact_vs_reencode.identical_answers'].value:,} of {r['exact_vs_reencode.inputs'].value:,} identical"
    if "logit_check.max_abs_logit_diff" in r.metrics:
        text += (f"; logits within {r['logit_check.max_abs_logit_diff'].value:.1e} "
                 f"({r['logit_check.inputs'].value} inputs)")
    return text


def _compressed(r: Record) -> str:
    if "compressed_vs_exact.agreeing_answers" not in r.metrics:
        return "not compared (random weights)" if r.config.get("shape") else "—"
    gap = r.metrics.get("compressed_vs_exact.accuracy_minus_dense")
    return (f"agrees on {r['compressed_vs_exact.agreeing_answers'].value:,} of "
            f"{r['compressed_vs_exact.inputs'].value:,}"
            + (f"; accuracy {metric_text(gap, FORMATS['diff'])}" if gap and gap.value is not None else ""))


def answer_throughput(records: Records) -> str:
    """BENCHMARKS' 'Answering with a chosen prompt': one row per ``bench answer`` record."""
    read = [as_record(name, raw) for name, raw in records.glob("answer-throughput-*.json")]
    read.sort(key=lambda r: (r.config.get("shape") or "", r.config["k"]))
    columns = [
        Column("prompt", cell=_prompt), Column("command", cell=lambda r: f"`{r.config['command']}`"),
        Column("inputs", cell=lambda r: f"{r['shared-exact.inputs'].value:,}" if _ran(r, "shared-exact") else "—"),
        Column("prefix shared, exact: answers/s (x re-encoding), peak RSS", cell=_rate("shared-exact")),
        Column("prefix shared, compressed", cell=_rate("shared-compressed")),
        Column("re-encoded per input", cell=_rate("reencode")),
        Column("exact against re-encoding", cell=_identity),
        Column("compressed against the dense prompt", cell=_compressed),
        Column("accuracy, dense prompt", metric="shared-exact.accuracy"),
        Column("record", cell=lambda r: records.link(r.name)),
    ]
    return render(read, columns)
