"""``icl-ssm bench answer``'s records (``docs/results/answer-throughput-*.json``): answering with a chosen prompt
whose prefix is shared exactly, shared compressed, or re-encoded per input."""

from __future__ import annotations

from typing import Any

from icl_ssm.records import Metric, Record

from .common import difference

PATHS = ("shared-exact", "shared-compressed", "reencode")
# the stored agreements, under the names the record's metrics take
AGREEMENTS = {"shared-exact vs reencode": "exact_vs_reencode", "logit_check": "logit_check",
              "shared-compressed vs shared-exact": "compressed_vs_exact"}
UNITS = {"inputs": "inputs", "identical_answers": "inputs", "agreeing_answers": "inputs", "vocabulary": "tokens",
         "agreement_with_dense": "share", "max_abs_logit_diff": "logit", "max_abs_label_score_diff": "label score"}


def _path(row: dict[str, Any]) -> dict[str, Metric]:
    p, n = row["path"], row.get("inputs")
    return {f"{p}.inputs": Metric(n, unit="inputs"),
            f"{p}.answers_per_second": Metric(row.get("answers_per_second"), n=n, unit="answers per second"),
            f"{p}.x_reencode": Metric(row.get("x_reencode"), unit="ratio to re-encoding"),
            f"{p}.peak_rss_mib": Metric(row.get("peak_rss_mib"), unit="MiB"),
            f"{p}.prompt_tokens": Metric(row.get("prompt_tokens"), unit="tokens")}


def answer_throughput(raw: dict[str, Any], name: str) -> Record:
    """One ``bench answer`` record. Per path ``p`` run (of :data:`PATHS`): ``p.inputs``, ``p.answers_per_second``,
    ``p.x_reencode`` (its answers per second over re-encoding's), ``p.peak_rss_mib``, ``p.prompt_tokens``; for every
    path of :data:`PATHS`, ``p.accuracy`` (None where not run or not scored: random weights), its interval over the
    test examples answered. Per agreement stored: ``exact_vs_reencode.`` ``inputs``, ``identical_answers``,
    ``max_abs_label_score_diff``; ``logit_check.`` ``inputs``, ``max_abs_logit_diff``; ``compressed_vs_exact.``
    ``inputs``, ``agreeing_answers``, ``agreement_with_dense`` (a share) and ``accuracy_minus_dense`` (paired,
    its interval over the test examples). Config: the bench's settings and command."""
    rows = {row["path"]: row for row in raw.get("rows") or []}
    metrics: dict[str, Metric] = {}
    for row in rows.values():
        metrics |= _path(row)
    metrics |= {f"{p}.accuracy": difference((rows.get(p) or {}).get("accuracy"), unit="accuracy") for p in PATHS}
    for stored, named in AGREEMENTS.items():
        for q, v in ((raw.get("agreement") or {}).get(stored) or {}).items():
            if q == "accuracy_minus_dense":
                metrics[f"{named}.{q}"] = difference(v)
            elif q in UNITS:
                metrics[f"{named}.{q}"] = Metric(v, unit=UNITS[q])
    prov = raw.get("provenance") or {}
    return Record({"process": prov}, {**(raw.get("settings") or {}), "command": prov.get("command")}, metrics, {},
                  name)


FAMILIES = {"answer-throughput-": answer_throughput}
