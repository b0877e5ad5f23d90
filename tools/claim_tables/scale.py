"""Selection cost at scale: BENCHMARKS' CPU table, docs/cost-at-scale.md's measured, projected and per-run tables.

Reads the ``icl-ssm bench scale`` records (:data:`SCALE_CPU`, the Qwen2.5-0.5B shape, and
:data:`SCALE_SMOLLM2`: each evaluator's FLOPs, seconds and memory per evaluated subset), the FLOPs projected
from every paper shape (:data:`SCALE_PROJECTED`) and the cold demo record, from which :func:`run_costs`
projects one ``run`` per model size. Until its records are stored a table is ``pending`` (``tools/claims.py``).
"""

from __future__ import annotations

from .base import BENCH, Records, cite, table
from .demo import newest_runs

SCALE_CPU = "scale-qwen2.5-0.5b-cpu.json"
SCALE_SMOLLM2 = "scale-smollm2-135m-cpu.json"
SCALE_PROJECTED = "scale-projected.json"
SCALE_PROFILE = "scale-profile-qwen2.5-0.5b-k50.json"
GiB = 1024**3


def scale_shapes(records: Records, *names: str) -> list[dict]:
    return [shape for name in names for shape in records(name)["shapes"]]


def scale_row(shape: dict, k: int, evaluator: str) -> dict:
    return next(r for r in shape["rows"] if r["k"] == k and r["evaluator"] == evaluator)


def scale_saving(shape: dict, k: int, dense: str, compressed: str) -> tuple[float, float]:
    """(FLOP saving, time saving) of ``compressed`` against ``dense`` per evaluated subset."""
    d, c = scale_row(shape, k, dense), scale_row(shape, k, compressed)
    return d["flops_per_subset"] / c["flops_per_subset"], d["seconds_per_subset"] / c["seconds_per_subset"]


def scale_command(record: dict) -> str:
    return f"`{record['provenance']['command']}`"


def scale_cpu(records: Records) -> str:
    """BENCHMARKS' 'Selection cost at scale': the Qwen2.5-0.5B shape on the CPU, the GPU rows."""
    record = records(SCALE_CPU)
    (shape,) = record["shapes"]
    machine = f"CPU, {record['threads']} thread{'s' if record['threads'] > 1 else ''}, random weights"
    link = cite(records, "[cost at scale](docs/cost-at-scale.md)", SCALE_CPU)
    queries = record["settings"]["queries"]
    rows = []
    for k in shape["k"]:
        f, t = scale_saving(shape, k, "dense-packed", "compressed-packed")
        fl, tl = scale_saving(shape, k, "dense-lean-packed", "compressed-packed")
        met = f >= 4 and f / t <= 1.5
        rows.append([
            f"k = {k}, Qwen2.5-0.5B shape: packed compressed (the recipe's compressor, 36 slots) vs packed dense "
            f"prefix shared by {queries} queries", scale_command(record), machine,
            f"{f:.1f}x fewer FLOPs, {t:.1f}x less time (FLOPs / time {f / t:.2f}); against a dense prefix built "
            f"without the LM head over the prompt: {fl:.1f}x, {tl:.1f}x ({fl / tl:.2f})",
            ">= 4x FLOPs, time within 1.5x of it" + (f": {'met' if met else 'not met'}" if k == 50 else ""), link])
    paper = {k: scale_saving(shape, k, "dense-packed", "paper-compressed-packed") for k in shape["k"]}
    per_query = {k: scale_saving(shape, k, "dense-per-query", "compressed") for k in shape["k"]}
    rows.append([
        "the paper's compressor (16 virtual + 4 sinks, 20 slots) vs packed dense, same shape", "same", machine,
        "; ".join(f"k = {k}: {f:.1f}x FLOPs, {t:.1f}x time" for k, (f, t) in paper.items()), "—", link])
    rows.append([
        "compressed (36 slots) vs a dense prompt per query (the paper's accounting), same shape", "same", machine,
        "; ".join(f"k = {k}: {f:.1f}x FLOPs, {t:.1f}x time" for k, (f, t) in per_query.items())
        + f" (per query measured on {scale_row(shape, shape['k'][0], 'dense-per-query')['queries_measured']} "
          f"queries, scaled to {queries})", "—", link])
    top = max(shape["k"])
    above = {e: scale_row(shape, top, e)["working_bytes"] / GiB
             for e in ("dense-packed", "dense-lean-packed", "compressed-packed")}
    step = next(d for d in shape["distill"] if d["k"] == top)
    rows.append([
        f"memory above the weights ({shape['weights_bytes'] / GiB:.2f} GiB, float32), k = {top}", "same",
        machine + ", peak RSS of a child process per case",
        f"dense packed {above['dense-packed']:.2f} GiB (its LM-head logits over the prompt), without them "
        f"{above['dense-lean-packed']:.2f}; compressed packed {above['compressed-packed']:.2f}; one distillation "
        f"step {step['working_bytes'] / GiB:.2f} GiB, {step['seconds']:.1f} s", "—", link])
    builds = {b["case"]: b for b in shape["builds"] if b["k"] == top}
    rows.append([
        f"the cache build alone, k = {top} ({builds['dense']['prompt_tokens']} tokens)", "same", machine,
        f"dense {builds['dense']['flops'] / 1e9:.0f} GFLOP, {builds['dense']['seconds']:.1f} s "
        f"(without the prompt's LM head {builds['dense-lean']['seconds']:.1f} s); compressed "
        f"{builds['compressed']['flops'] / 1e9:.0f} GFLOP, {builds['compressed']['seconds']:.2f} s; the paper's "
        f"{builds['paper-compressed']['flops'] / 1e9:.0f} GFLOP, {builds['paper-compressed']['seconds']:.2f} s",
        "—", link])
    rows.append([
        "every paper shape (Qwen2.5-0.5B to 7B, Llama-3.1-8B, Gemma-3-1B) at k = 20, 50, 200 and the longest "
        "prompt, bfloat16", "`tools/gpu_scale.sh OUT`", "one GPU",
        "not yet measured (no GPU lent so far); the script is tested on tiny shapes on the CPU; FLOPs projected "
        "from the shapes: [cost at scale](docs/cost-at-scale.md#every-shape-projected)", "under 8 minutes", "—"])
    return table(BENCH, rows)


def scale_measured(records: Records) -> str:
    """docs/cost-at-scale.md: every measured row of the CPU records, per evaluated subset."""
    rows = []
    for shape in scale_shapes(records, SCALE_SMOLLM2, SCALE_CPU):
        for r in shape["rows"]:
            note = f" ({r['queries_measured']} queries, scaled)" if "queries_measured" in r else ""
            rows.append([shape["shape"], str(r["k"]), f"{r['prompt_tokens']:.0f}", r["evaluator"] + note,
                         f"{r['flops_per_subset'] / 1e9:.1f}", f"{r['seconds_per_subset']:.2f}",
                         f"{r['peak_bytes'] / GiB:.2f}", f"{r['working_bytes'] / GiB:.2f}",
                         f"{r['flops_vs_compressed']:.1f}x", f"{r['seconds_vs_compressed']:.1f}x"])
    return table(["shape", "k", "prompt tokens", "evaluator", "GFLOP / subset", "s / subset", "peak GiB",
                  "above weights GiB", "FLOPs vs compressed", "time vs compressed"], rows)


def scale_projected(records: Records) -> str:
    """docs/cost-at-scale.md: FLOPs per evaluated subset projected from every shape."""
    record = records(SCALE_PROJECTED)
    rows = []
    for shape in record["shapes"]:
        for p in shape["projected"]:
            saving = [f"{p['dense-packed'] / p[n]:.1f}x" if n in p else "—"
                      for n in ("compressed-packed", "paper-compressed-packed", "window-compressed-packed")]
            rows.append([shape["shape"], str(p["k"]), str(p["prompt_tokens"]), f"{p['dense-packed'] / 1e12:.2f}",
                         f"{p['compressed-packed'] / 1e12:.3f}", *saving,
                         f"{p['dense-lean-packed'] / p['compressed-packed']:.1f}x",
                         f"{p['dense-per-query'] / p['compressed'] :.1f}x"])
    return table(["shape", "k", "prompt tokens", "dense packed TFLOP", "compressed packed TFLOP",
                  "saving (recipe, 36 slots)", "saving (paper, 20 slots)", "saving (window exact)",
                  "saving against the lean dense prefix", "saving against a prompt per query"], rows)


def run_costs(records: Records) -> str:
    """docs/cost-at-scale.md: what one demo `icl-ssm run` costs per model size on the CPU, measured (the
    SmolLM2 demo) or projected from its non-search time by the ratio of dense seconds per subset."""
    demos = [r for _, r in newest_runs(records)]  # the cold demos of the newest commit, averaged
    demo_seconds = sum(r["demo_seconds"] for r in demos) / len(demos)
    cpu = {s["shape"]: s for s in scale_shapes(records, SCALE_SMOLLM2, SCALE_CPU)}
    projected = {s["shape"]: s for s in records(SCALE_PROJECTED)["shapes"]}
    k = 20
    base = scale_row(cpu["smollm2-135m"], k, "dense-packed")["seconds_per_subset"]
    anchor = scale_row(cpu["qwen2.5-0.5b"], k, "dense-packed")
    rate = anchor["flops_per_subset"] / anchor["seconds_per_subset"]  # FLOP/s of the largest measured shape
    search = sum(r["search"]["wall_seconds"] for r in demos) / len(demos)
    work = demo_seconds - search
    rows = []
    for name, shape in projected.items():
        p = next(p for p in shape["projected"] if p["k"] == k)
        if name in cpu:
            seconds, how = scale_row(cpu[name], k, "dense-packed")["seconds_per_subset"], "measured"
        else:
            seconds, how = p["dense-packed"] / rate, "projected (FLOPs / the 0.5B shape's FLOP/s)"
        if name == "smollm2-135m":
            runs = "one run" if len(demos) == 1 else f"the mean of {len(demos)} runs"
            minutes, source = demo_seconds / 60, f"minutes measured (the cold demo, {runs}, 2 cores)"
        else:
            minutes = (work * seconds / base + demos[0]["search"]["budget_seconds"]) / 60
            source = f"minutes projected, the dense subset {how}"
        weights = shape["params"] * 4 / GiB
        logits = 8 * p["prompt_tokens"] * shape["vocab"] * 4 / GiB  # run's batch of 8 dense prefixes
        kv = 8 * p["prompt_tokens"] * 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * 4 / GiB
        rows.append([name, f"{shape['params'] / 1e9:.2f} B", f"{weights:.1f} / {weights / 2:.1f}",
                     f"{seconds:.1f}", f"{minutes:.0f}", f"{weights + logits + kv:.1f}",
                     "yes" if weights + logits + kv <= 24 else "no", source])
    return table(["model", "parameters", "weights GiB (float32 / bfloat16)", "dense s / subset, k = 20 (1 thread)",
                  "one demo `run`, minutes (CPU)", "one `run`, GiB (float32, from the shape)", "fits 24 GiB", "how"],
                 rows)


def scale_profile(records: Records) -> str:
    """docs/cost-at-scale.md: where one packed subset evaluation's seconds go (torch.profiler), per
    path: matrix products, attention and the rest, with the FLOPs each path is counted."""
    r = records(SCALE_PROFILE)
    rows = []
    for path in ("dense-packed", "compressed-packed"):
        p = r[path]
        kinds = p["seconds_by_kind"]
        rows.append([path, f"{p['gflops']:.0f}", f"{p['seconds']:.2f}", f"{p['gflop_per_s']:.0f}",
                     f"{kinds.get('matmul', 0):.2f} ({p['matmul_gflop_per_s']:.0f} GFLOP/s)",
                     f"{kinds.get('attention', 0):.2f}", f"{kinds.get('other', 0):.2f}",
                     f"{kinds.get('other', 0) / p['seconds']:.0%}"])
    rows.append(["dense / compressed", f"{r['flop_saving']:.1f}x", f"{r['time_saving']:.1f}x", "", "", "", "", ""])
    return table(["path (" + f"{r['shape']}, k = {r['k']}, {r['queries']} queries, {r['threads']} thread)",
                  "GFLOP", "s", "GFLOP/s", "matrix products, s", "attention, s", "the rest, s",
                  "the rest, share"], rows)
