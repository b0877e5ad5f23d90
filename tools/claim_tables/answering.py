"""BENCHMARKS' 'Answering with a chosen prompt': one row per ``answer-throughput-*.json`` record that
``icl-ssm bench answer`` writes (answers per second and memory with the prefix shared exactly, compressed, or
re-encoded per input, and how far the paths agree)."""

from __future__ import annotations

from .base import Records, ci, table


def answer_throughput(records: Records) -> str:
    """BENCHMARKS' 'Answering with a chosen prompt': one row per ``bench answer`` record."""
    rows = []
    found = records.glob("answer-throughput-*.json")
    for name, r in sorted(found, key=lambda nr: (nr[1]["settings"].get("shape") or "", nr[1]["settings"]["k"])):
        s, paths = r["settings"], {row["path"]: row for row in r["rows"]}
        exact, comp, base = paths.get("shared-exact"), paths.get("shared-compressed"), paths.get("reencode")
        model = f"{s['shape']} shape, random weights" if s.get("shape") else s["model"]
        prompt = (exact or base)["prompt_tokens"]

        def rate(row: dict | None) -> str:
            if row is None:
                return "—"
            x = f" ({row['x_reencode']:.1f}x)" if "x_reencode" in row and row is not base else ""
            return f"{row['answers_per_second']:.2f}{x}, {row['peak_rss_mib']:,.0f} MiB"

        same = r["agreement"].get("shared-exact vs reencode")
        logits = r["agreement"].get("logit_check")
        identity = "—"
        if same:
            identity = f"{same['identical_answers']:,} of {same['inputs']:,} identical"
            if logits:
                identity += f"; logits within {logits['max_abs_logit_diff']:.1e} ({logits['inputs']} inputs)"
        versus = r["agreement"].get("shared-compressed vs shared-exact")
        if versus:
            gap = versus.get("accuracy_minus_dense")
            compressed = (f"agrees on {versus['agreeing_answers']:,} of {versus['inputs']:,}"
                          + (f"; accuracy {gap['mean']:+.3f} {ci(gap['ci95'], '+.3f')}" if gap else ""))
        else:
            compressed = "not compared (random weights)" if s.get("shape") else "—"
        acc = (exact or {}).get("accuracy")
        rows.append([f"{model}, {s['task']}, k = {s['k']} ({prompt} tokens)",
                     f"`{r['provenance']['command']}`",
                     f"{exact['inputs']:,}" if exact else "—",
                     rate(exact), rate(comp), rate(base) + (f" ({base['inputs']:,} inputs)" if base else ""),
                     identity, compressed,
                     f"{acc['mean']:.3f} {ci(acc['ci95'], '.3f')}" if acc else "—",
                     records.link(name)])
    return table(["prompt", "command", "inputs", "prefix shared, exact: answers/s (x re-encoding), peak RSS",
                  "prefix shared, compressed", "re-encoded per input", "exact against re-encoding",
                  "compressed against the dense prompt", "accuracy, dense prompt [95% CI over inputs]", "record"],
                 rows)
