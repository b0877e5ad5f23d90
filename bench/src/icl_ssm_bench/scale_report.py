"""``bench scale``'s record as markdown: the savings, every evaluator per subset, the cache builds,
the distillation step and the projected FLOPs; the issue's target read from a measured shape."""

from __future__ import annotations

from icl_ssm_bench.shapes import RANDOM_WEIGHTS, GiB

TARGET_K, TARGET_FLOP_SAVING, TARGET_GAP = 50, 4.0, 1.5  # issue #47: at k = 50, >= 4x FLOPs, time within 1.5x


def savings(shape: dict) -> list[dict]:
    """Per ``k``, compressor and dense reference of a measured shape: the FLOP and time saving of
    the packed compressed evaluator against the packed dense one (prefix shared by the queries),
    their ratio ``gap`` (FLOP saving / time saving), and the projected FLOP saving beside them."""
    rows = {(r["k"], r["evaluator"]): r for r in shape.get("rows", [])}
    projected = {p["k"]: p for p in shape["projected"]}
    out = []
    for k in shape["k"]:
        for c, info in shape["compressors"].items():
            name = "compressed-packed" if c == "recipe" else f"{c}-compressed-packed"
            for dense in ("dense-packed", "dense-lean-packed"):
                d, m = rows.get((k, dense)), rows.get((k, name))
                flops = time_ = gap = None
                if d and m:
                    flops = d["flops_per_subset"] / m["flops_per_subset"]
                    time_ = d["seconds_per_subset"] / m["seconds_per_subset"]
                    gap = flops / time_
                out.append({"k": k, "compressor": c, "cache_slots": info["cache_slots"], "dense": dense,
                            "flop_saving": flops, "time_saving": time_, "gap": gap,
                            "projected_flop_saving": projected[k][dense] / projected[k][name]})
    return out


def target(shape: dict) -> dict | None:
    """Issue #47's target on a measured shape, at k = 50, the recipe's compressor against the packed
    dense evaluator (both dense references): FLOP saving >= 4x, time saving within 1.5x of it."""
    out = {}
    for s in savings(shape):
        if s["k"] == TARGET_K and s["compressor"] == "recipe" and s["flop_saving"] is not None:
            out[s["dense"]] = {"flop_saving": s["flop_saving"], "time_saving": s["time_saving"], "gap": s["gap"],
                               "met": s["flop_saving"] >= TARGET_FLOP_SAVING and s["gap"] <= TARGET_GAP}
    return out or None


def _count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.0f} M"


def _x(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f}x"


def _g(v: float | None) -> str:
    return "—" if v is None else f"{v / 1e9:.1f}"


def _mem(v: float | None) -> str:
    return "—" if v is None else f"{v / GiB:.2f}"


def scale_markdown(result: dict) -> str:
    """The run as markdown: shapes and compressors, the savings, every evaluator per subset, the
    cache builds and the distillation step; refusals and skipped cases said in words."""
    st = result["settings"]
    p = st["prompts"]
    memory = ("peak memory: `torch.cuda.max_memory_allocated` in the timed pass" if st["device"].startswith("cuda")
              else "peak memory: the resident set of a child process that runs every case once more (the kernel's "
                   "high-water mark reset before each case, freed memory returned to the system)")
    lines = [f"**{RANDOM_WEIGHTS}**", "",
             f"{st['device']}, {st['dtype']}, {result['threads']} torch threads. Per evaluated subset: "
             f"{st['queries']} queries of {p['query_tokens']} tokens, demonstrations of {p['demo_tokens']} tokens "
             f"(synthetic tokens, Rotten Tomatoes' lengths); {st['subsets']} measured subset(s) a case, "
             f"{st['batch'] or 'as many as fit'} a batch; FLOPs counted (`FlopCounterMode`, attention included) in "
             "a pass of their own, seconds from a pass without the counter; dense per query measured on "
             f"{st['per_query_queries']} queries and scaled to {st['queries']}; {memory}. `dense-lean`: the dense "
             "prefix without the LM head over the prompt (`select`'s dense evaluator computes it at every prompt "
             "token). Projected: FLOPs from the shape (`projected_flops`).", ""]
    lines += ["| shape | layers | hidden | heads / KV | head_dim | vocab | context | window | parameters | "
              "weights GiB | compressors: params (cache slots) |",
              "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for sh in result["shapes"]:
        published = f" ({_count(sh['published_params'])} published)" if sh["published_params"] else ""
        comps = "; ".join(f"{c} {i['params'] / 1e6:.1f} M ({i['cache_slots']})" for c, i in sh["compressors"].items())
        weights = sh.get("weights_bytes") or sh.get("estimate_bytes", {}).get("weights")
        lines.append(f"| {sh['shape']} | {sh['layers']} | {sh['hidden']} | {sh['heads']} / {sh['kv_heads']} | "
                     f"{sh['head_dim']} | {sh['vocab']} | {sh['context']} | {sh['window'] or '—'} | "
                     f"{_count(sh['params'])}{published} | {_mem(weights)} | {comps} |")
    refused = [sh for sh in result["shapes"] if sh.get("refused")]
    for sh in refused:
        lines += ["", f"**{sh['shape']}: refused**, {sh['refused']}."]
    for sh in result["shapes"]:
        for k, why in sh.get("refused_k", {}).items():
            lines += ["", f"**{sh['shape']}, k = {k}: refused**, {why}."]
    measured = [sh for sh in result["shapes"] if sh.get("rows")]
    if measured:
        lines += ["", "Savings per evaluated subset, packed compressed against packed dense (prefix shared by the "
                  "queries); FLOPs / time: how far the time saving falls short of the FLOP saving.", "",
                  "| shape | k | prompt tokens | compressor (slots) | against | FLOP saving | time saving | "
                  "FLOPs / time | projected FLOP saving |", "|---|---:|---:|---|---|---:|---:|---:|---:|"]
        for sh in measured:
            prompts = {p["k"]: p["prompt_tokens"] for p in sh["projected"]}
            for s in savings(sh):
                lines.append(f"| {sh['shape']} | {s['k']} | {prompts[s['k']]} | {s['compressor']} "
                             f"({s['cache_slots']}) | {s['dense']} | {_x(s['flop_saving'])} | {_x(s['time_saving'])} | "
                             f"{_x(s['gap'], 2)} | {_x(s['projected_flop_saving'])} |")
        lines += ["", "Per evaluated subset, every evaluator (against the compressed evaluator on the same query "
                  "path: `-packed` rows against `compressed-packed`, the others against `compressed`).", "",
                  "| shape | k | evaluator | batch | GFLOP | projected GFLOP | s | peak GiB | above weights GiB | "
                  "FLOPs vs compressed | time vs compressed |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for sh in measured:
            projected = {p["k"]: p for p in sh["projected"]}
            for r in sh["rows"]:
                note = f" ({r['queries_measured']} queries, scaled)" if "queries_measured" in r else ""
                lines.append(f"| {sh['shape']} | {r['k']} | {r['evaluator']}{note} | {r['batch']} | "
                             f"{_g(r['flops_per_subset'])} | {_g(projected[r['k']].get(r['evaluator']))} | "
                             f"{r['seconds_per_subset']:.3f} | {_mem(r.get('peak_bytes'))} | "
                             f"{_mem(_above(sh, r))} | {r['flops_vs_compressed']:.1f}x | "
                             f"{r['seconds_vs_compressed']:.1f}x |")
        lines += ["", "The cache build alone, per prompt.", "",
                  "| shape | k | cache | GFLOP | s | peak GiB | above weights GiB |",
                  "|---|---:|---|---:|---:|---:|---:|"]
        for sh in measured:
            for b in sh["builds"]:
                lines.append(f"| {sh['shape']} | {b['k']} | {b['case']} | {_g(b['flops'])} | {b['seconds']:.3f} | "
                             f"{_mem(b.get('peak_bytes'))} | {_mem(_above(sh, b))} |")
        steps = [(sh, d) for sh in measured for d in sh["distill"]]
        if steps:
            d0 = steps[0][1]
            lines += ["", f"One distillation step of the recipe's compressor (stage 2, forward and backward, "
                      f"{d0['group_size']} prompts x {d0['queries']} queries, teacher targets cached).", "",
                      "| shape | k | GFLOP | s | peak GiB | above weights GiB |", "|---|---:|---:|---:|---:|---:|"]
            for sh, d in steps:
                lines.append(f"| {sh['shape']} | {d['k']} | {_g(d['flops'])} | {d['seconds']:.3f} | "
                             f"{_mem(d.get('peak_bytes'))} | {_mem(_above(sh, d))} |")
    for sh in result["shapes"]:
        if sh.get("memory_not_measured"):
            lines += ["", f"{sh['shape']}: memory not measured ({sh['memory_not_measured']})."]
        if sh.get("skipped"):
            lines += ["", f"{sh['shape']}: skipped when the time budget ran out: {', '.join(sh['skipped'])}."]
    lines += ["", "Projected FLOPs per evaluated subset (GFLOP; from the shape, the compressors counted).", "",
              "| shape | k | prompt tokens | dense-packed | dense-lean-packed | dense-per-query | compressed-packed | "
              "paper-compressed-packed | window-compressed-packed | saving, packed (recipe / paper / window) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for sh in result["shapes"]:
        for pr in sh["projected"]:
            ratio = " / ".join(_x(pr["dense-packed"] / pr[n]) if n in pr else "—"
                               for n in ("compressed-packed", "paper-compressed-packed", "window-compressed-packed"))
            gflops = " | ".join(_g(pr.get(n)) for n in ("dense-packed", "dense-lean-packed", "dense-per-query",
                                                        "compressed-packed", "paper-compressed-packed",
                                                        "window-compressed-packed"))
            lines.append(f"| {sh['shape']} | {pr['k']} | {pr['prompt_tokens']} | {gflops} | {ratio} |")
    for sh in measured:
        t = target(sh)
        if t:
            lines += ["", f"Target at k = {TARGET_K} on {sh['shape']} (recipe, packed; >= {TARGET_FLOP_SAVING:.0f}x "
                      f"FLOPs, time within {TARGET_GAP}x of it): " + "; ".join(
                          f"against {d}: {v['flop_saving']:.1f}x FLOPs, {v['time_saving']:.1f}x time, "
                          f"{'met' if v['met'] else 'not met'}" for d, v in t.items()) + "."]
    return "\n".join(lines)


def _above(shape: dict, row: dict) -> float | None:
    """Memory a case adds to the weights: measured on the CPU (``working_bytes``), the peak less
    the memory allocated before the run on a GPU."""
    if "working_bytes" in row:
        return row["working_bytes"]
    base = shape.get("weights_allocated_bytes")
    return None if base is None or row.get("peak_bytes") is None else row["peak_bytes"] - base
