"""``icl-ssm bench scale`` records (``scale-<shape>-cpu.json``, measured on the CPU; ``scale-projected.json``,
FLOPs projected from the shapes alone), the profile of one packed subset evaluation (``scale-profile-*``), and
:func:`run_costs`, one demo ``icl-ssm run`` per model size projected from them and the cold demos.

A bench-scale record's metrics are named by where they sit: ``<shape>.<quantity>`` for the shape itself,
``<shape>/k<k>/<what>.<quantity>`` for one number at ``k`` demonstrations, so that
``record.part("qwen2.5-0.5b/k20/dense-packed")`` is one row (:func:`where` reads the part's name back). Every
number is one measurement or one count (the bench evaluates one subset per case, once): none has an interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from icl_ssm.records import Metric, Record

GiB = 1024**3
# a saving: the dense evaluator's cost over the compressed one's, per evaluated subset
SAVINGS = {"recipe": ("dense-packed", "compressed-packed"), "paper": ("dense-packed", "paper-compressed-packed"),
           "window": ("dense-packed", "window-compressed-packed"), "lean": ("dense-lean-packed", "compressed-packed"),
           "per_query": ("dense-per-query", "compressed")}
UNITS = {"k": "demonstrations", "prompt_tokens": "tokens", "flops_per_subset": "FLOPs", "seconds_per_subset": "seconds",
         "peak_bytes": "bytes", "working_bytes": "bytes", "flops_vs_compressed": "ratio",
         "seconds_vs_compressed": "ratio", "queries_measured": "queries", "flops": "FLOPs", "seconds": "seconds",
         "params": "parameters", "vocab": "tokens", "layers": "count", "kv_heads": "count", "head_dim": "count",
         "weights_bytes": "bytes"}
RUN_BATCH = 8  # dense prefixes `icl-ssm run` evaluates at once


def where(record: Record) -> tuple[str, ...]:
    """A bench-scale part's place: ``(shape, "k<k>", what)`` from its name ``shape/k<k>/what``."""
    return tuple(record.config["part"].split("/"))


def measured_rows(record: Record) -> list[str]:
    """The names of a bench-scale record's measured rows (``shape/k<k>/<evaluator>``), in the order stored."""
    end = ".flops_per_subset"
    return [name[: -len(end)] for name in record.metrics if name.endswith(end)]


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _numbers(prefix: str, row: dict, names: Sequence[str]) -> dict[str, Metric]:
    return {f"{prefix}.{q}": Metric(row[q], unit=UNITS[q]) for q in names if row.get(q) is not None}


def _measured(s: str, shape: dict) -> dict[str, Metric]:
    """One shape's measured rows, cache builds, distillation steps and the savings between its evaluators."""
    metrics: dict[str, Metric] = {}
    rows = shape.get("rows") or []
    for r in rows:
        metrics |= _numbers(f"{s}/k{r['k']}/{r['evaluator']}", r,
                            ("k", "prompt_tokens", "flops_per_subset", "seconds_per_subset", "peak_bytes",
                             "working_bytes", "flops_vs_compressed", "seconds_vs_compressed", "queries_measured"))
    for b in shape.get("builds") or []:
        metrics |= _numbers(f"{s}/k{b['k']}/build-{b['case']}", b,
                            ("flops", "seconds", "prompt_tokens", "peak_bytes", "working_bytes"))
    for d in shape.get("distill") or []:
        metrics |= _numbers(f"{s}/k{d['k']}/distill", d, ("flops", "seconds", "peak_bytes", "working_bytes"))
    for k in sorted({r["k"] for r in rows}):
        by = {r["evaluator"]: r for r in rows if r["k"] == k}
        for pair, (dense, compressed) in SAVINGS.items():
            d, c = by.get(dense, {}), by.get(compressed, {})
            flops = _ratio(d.get("flops_per_subset"), c.get("flops_per_subset"))
            time = _ratio(d.get("seconds_per_subset"), c.get("seconds_per_subset"))
            metrics |= {f"{s}/k{k}/saving.{pair}_flops": Metric(flops, unit="ratio"),
                        f"{s}/k{k}/saving.{pair}_time": Metric(time, unit="ratio"),
                        f"{s}/k{k}/saving.{pair}_flops_per_time": Metric(_ratio(flops, time), unit="ratio")}
    return metrics


def _projected(s: str, shape: dict) -> dict[str, Metric]:
    """One shape's FLOPs per evaluated subset projected per evaluator (``flops.<evaluator>``) and their savings."""
    metrics: dict[str, Metric] = {}
    for p in shape.get("projected") or []:
        prefix = f"{s}/k{p['k']}/projected"
        metrics |= _numbers(prefix, p, ("k", "prompt_tokens"))
        metrics |= {f"{prefix}.flops.{e}": Metric(v, unit="FLOPs") for e, v in p.items()
                    if e not in ("k", "prompt_tokens")}
        metrics |= {f"{prefix}.{pair}_flops": Metric(_ratio(p.get(dense), p.get(compressed)), unit="ratio")
                    for pair, (dense, compressed) in SAVINGS.items()}
    return metrics


def bench_scale(raw: dict[str, Any], name: str) -> Record:
    """One ``icl-ssm bench scale`` record. Per shape ``s``: ``s.params``, ``s.vocab``, ``s.layers``, ``s.kv_heads``,
    ``s.head_dim``, ``s.weights_bytes`` (measured records); per ``k`` and evaluator ``e`` measured,
    ``s/k<k>/<e>.``: ``k``, ``prompt_tokens``, ``flops_per_subset``, ``seconds_per_subset``, ``peak_bytes``,
    ``working_bytes`` (above the weights), ``flops_vs_compressed``, ``seconds_vs_compressed``, ``queries_measured``
    (a dense prompt per query: measured on so many, scaled); ``s/k<k>/build-<case>.`` and ``s/k<k>/distill.``:
    ``flops``, ``seconds``, ``peak_bytes``, ``working_bytes``; ``s/k<k>/saving.<pair>_flops``, ``_time``,
    ``_flops_per_time``: the dense evaluator's FLOPs and seconds over the compressed one's (:data:`SAVINGS`);
    ``s/k<k>/projected.``: ``k``, ``prompt_tokens``, ``flops.<e>`` and ``<pair>_flops``, projected from the shape
    (None where the shape has no such evaluator). Config: the bench's settings, threads, command, shapes, ``k``."""
    metrics: dict[str, Metric] = {}
    shapes = raw.get("shapes") or []
    for shape in shapes:
        s = shape["shape"]
        metrics |= _numbers(s, shape, ("params", "vocab", "layers", "kv_heads", "head_dim", "weights_bytes"))
        metrics |= _measured(s, shape) | _projected(s, shape)
    prov = raw.get("provenance") or {}
    config = {"command": prov.get("command"), "threads": raw.get("threads"), "settings": raw.get("settings") or {},
              "shapes": [shape["shape"] for shape in shapes], "k": {shape["shape"]: shape["k"] for shape in shapes}}
    return Record({"process": prov}, config, metrics, {}, name)


def profile(raw: dict[str, Any], name: str) -> Record:
    """``research/scale_profile.py``'s record: per path ``p`` (``dense-packed``, ``compressed-packed``)
    ``p.gflops``, ``p.seconds``, ``p.gflop_per_s``, ``p.matmul_gflop_per_s``, and ``p.matmul_seconds``,
    ``p.attention_seconds``, ``p.other_seconds`` (torch.profiler's seconds by kind, 0 where none),
    ``p.other_share`` (the rest's share of the seconds); ``saving.flops``, ``saving.time``: dense over compressed."""
    metrics = {"saving.flops": Metric(raw.get("flop_saving"), unit="ratio"),
               "saving.time": Metric(raw.get("time_saving"), unit="ratio")}
    for path, p in raw.items():
        if not (isinstance(p, dict) and "seconds_by_kind" in p):
            continue
        kinds = p["seconds_by_kind"]
        metrics |= {f"{path}.gflops": Metric(p.get("gflops"), unit="GFLOP"),
                    f"{path}.seconds": Metric(p.get("seconds"), unit="seconds"),
                    f"{path}.gflop_per_s": Metric(p.get("gflop_per_s"), unit="GFLOP/s"),
                    f"{path}.matmul_gflop_per_s": Metric(p.get("matmul_gflop_per_s"), unit="GFLOP/s"),
                    f"{path}.other_share": Metric(_ratio(kinds.get("other", 0), p.get("seconds")), unit="share")}
        metrics |= {f"{path}.{kind}_seconds": Metric(kinds.get(kind, 0), unit="seconds")
                    for kind in ("matmul", "attention", "other")}
    prov = raw.get("provenance") or {}
    config = {"command": prov.get("command"), **{k: raw.get(k) for k in ("shape", "k", "queries", "threads")}}
    return Record({"process": prov}, config, metrics, {}, name)


def scale_family(raw: dict[str, Any], name: str) -> Record:
    """A ``scale-*`` record: the profile (``scale-profile-*``) or a bench-scale record (every other)."""
    return (profile if name.startswith("scale-profile-") else bench_scale)(raw, name)


def _demo_seconds(demos: Sequence[Record]) -> tuple[float, float]:
    """(mean seconds of a demo, mean seconds of it outside the search) over ``demos``."""
    demo_seconds = sum(d["demo_seconds"].value for d in demos) / len(demos)
    search = sum(d["search_wall_seconds"].value for d in demos) / len(demos)
    return demo_seconds, demo_seconds - search


def run_costs(projected: Record, measured: Sequence[Record], demos: Sequence[Record], k: int = 20,
              base: str = "smollm2-135m", anchor: str = "qwen2.5-0.5b") -> Record:
    """One demo ``icl-ssm run`` on the CPU per shape ``s`` of ``projected``: ``s.params``; ``s.weights_gib``
    (float32) and ``s.weights_gib_bf16``; ``s.dense_seconds``: one dense packed subset of ``k`` demonstrations,
    measured where a record of ``measured`` holds the shape, else its projected FLOPs over the FLOP/s measured on
    ``anchor``; ``s.minutes``: for ``base``, the mean of the cold ``demos`` (n: how many), else their mean time
    outside the search scaled by ``s.dense_seconds`` over ``base``'s, plus the first demo's search budget;
    ``s.run_gib``: the weights, the LM-head logits and the key-value cache of :data:`RUN_BATCH` dense prefixes,
    float32, from the shape. ``demos``: cold runs as ``readers/demo.py`` reads them (``demo_seconds``,
    ``search_wall_seconds``, ``search_budget_seconds``). ``config["how"][s]`` says what was measured; every number
    is a projection or one measurement, without an interval."""
    cpu = {s: r for r in measured for s in r.config["shapes"]}

    def seconds(s: str) -> float:
        return cpu[s][f"{s}/k{k}/dense-packed.seconds_per_subset"].value

    rate = cpu[anchor][f"{anchor}/k{k}/dense-packed.flops_per_subset"].value / seconds(anchor)  # FLOP/s
    demo_seconds, work = _demo_seconds(demos)
    metrics: dict[str, Metric] = {}
    how: dict[str, dict[str, str]] = {}
    for s in projected.config["shapes"]:
        shape, p = projected.part(s), projected.part(f"{s}/k{k}/projected")
        dense = seconds(s) if s in cpu else p["flops.dense-packed"].value / rate
        if s == base:
            minutes = Metric(demo_seconds / 60, n=len(demos), unit="minutes")
        else:
            budget = demos[0]["search_budget_seconds"].value
            minutes = Metric((work * dense / seconds(base) + budget) / 60, unit="minutes")
        tokens, weights = p["prompt_tokens"].value, shape["params"].value * 4 / GiB
        logits = RUN_BATCH * tokens * shape["vocab"].value * 4 / GiB
        kv = (RUN_BATCH * tokens * 2 * shape["layers"].value * shape["kv_heads"].value * shape["head_dim"].value
              * 4 / GiB)
        metrics |= {f"{s}.params": shape["params"], f"{s}.weights_gib": Metric(weights, unit="GiB"),
                    f"{s}.weights_gib_bf16": Metric(weights / 2, unit="GiB"),
                    f"{s}.dense_seconds": Metric(dense, unit="seconds"), f"{s}.minutes": minutes,
                    f"{s}.run_gib": Metric(weights + logits + kv, unit="GiB")}
        how[s] = {"seconds": "measured" if s in cpu else "projected",
                  "minutes": "measured" if s == base else "projected"}
    provenance = {r.name: r.provenance.get("process") for r in (projected, *measured)}
    provenance |= {d.name: d.provenance.get("process") for d in demos}
    config = {"k": k, "base": base, "anchor": anchor, "shapes": projected.config["shapes"], "how": how,
              "demos": [d.name for d in demos]}
    return Record(provenance, config, metrics, {}, "run-costs")


FAMILIES = {"scale-": scale_family}
