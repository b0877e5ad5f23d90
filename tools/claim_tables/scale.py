"""Selection cost at scale: BENCHMARKS' CPU table, docs/cost-at-scale.md's measured, projected and per-run tables.

Reads the ``icl-ssm bench scale`` records (:data:`SCALE_CPU`, the Qwen2.5-0.5B shape, and
:data:`SCALE_SMOLLM2`: each evaluator's FLOPs, seconds and memory per evaluated subset), the FLOPs projected
from every paper shape (:data:`SCALE_PROJECTED`), the profile of one packed subset (:data:`SCALE_PROFILE`) and
the cold demo records, from which :func:`run_costs` projects one ``run`` per model size; every record through the
one adapter (``readers/scale.py`` names their metrics), every table through the one renderer. Until its records
are stored a table is ``pending`` (``tools/claims.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from icl_ssm.records import Record

from .adapt import as_record, read
from .base import BENCH, Records, cite
from .readers.demo import newest_runs
from .readers.scale import GiB, measured_rows, where
from .readers.scale import run_costs as project_run_costs
from .render import Column, render

SCALE_CPU = "scale-qwen2.5-0.5b-cpu.json"
SCALE_SMOLLM2 = "scale-smollm2-135m-cpu.json"
SCALE_PROJECTED = "scale-projected.json"
SCALE_PROFILE = "scale-profile-qwen2.5-0.5b-k50.json"
PAGES = "[cost at scale](docs/cost-at-scale.md)"


def _row(record: Record, row: str) -> Record:
    """``record`` as the row ``row`` of a summary table, whose rows say different things of one record."""
    return replace(record, config={**record.config, "row": row})


def _x(r: Record, name: str) -> float:
    return r[name].value


def _machine(r: Record) -> str:
    threads = r.config["threads"]
    return f"CPU, {threads} thread{'s' if threads > 1 else ''}, random weights"


def _at_k(r: Record) -> list[str]:
    """The packed compressed cache against the packed dense prefix at one k (a ``saving`` part)."""
    k = int(where(r)[1][1:])
    f, t, ft = (_x(r, f"recipe_{q}") for q in ("flops", "time", "flops_per_time"))
    fl, tl, flt = (_x(r, f"lean_{q}") for q in ("flops", "time", "flops_per_time"))
    met = f >= 4 and ft <= 1.5
    return [f"k = {k}, Qwen2.5-0.5B shape: packed compressed (the recipe's compressor, 36 slots) vs packed dense "
            f"prefix shared by {r.config['settings']['queries']} queries", f"`{r.config['command']}`", _machine(r),
            f"{f:.1f}x fewer FLOPs, {t:.1f}x less time (FLOPs / time {ft:.2f}); against a dense prefix built "
            f"without the LM head over the prompt: {fl:.1f}x, {tl:.1f}x ({flt:.2f})",
            ">= 4x FLOPs, time within 1.5x of it" + (f": {'met' if met else 'not met'}" if k == 50 else "")]


def _savings(r: Record, pair: str) -> str:
    (s,) = r.config["shapes"]
    return "; ".join(f"k = {k}: {_x(r, f'{s}/k{k}/saving.{pair}_flops'):.1f}x FLOPs, "
                     f"{_x(r, f'{s}/k{k}/saving.{pair}_time'):.1f}x time" for k in r.config["k"][s])


def _paper(r: Record) -> list[str]:
    return ["the paper's compressor (16 virtual + 4 sinks, 20 slots) vs packed dense, same shape", "same",
            _machine(r), _savings(r, "paper"), "—"]


def _per_query(r: Record) -> list[str]:
    (s,) = r.config["shapes"]
    measured = _x(r, f"{s}/k{r.config['k'][s][0]}/dense-per-query.queries_measured")
    return ["compressed (36 slots) vs a dense prompt per query (the paper's accounting), same shape", "same",
            _machine(r), _savings(r, "per_query")
            + f" (per query measured on {measured} queries, scaled to {r.config['settings']['queries']})", "—"]


def _memory(r: Record) -> list[str]:
    (s,) = r.config["shapes"]
    top = max(r.config["k"][s])
    above = {e: _x(r, f"{s}/k{top}/{e}.working_bytes") / GiB
             for e in ("dense-packed", "dense-lean-packed", "compressed-packed")}
    return [f"memory above the weights ({_x(r, f'{s}.weights_bytes') / GiB:.2f} GiB, float32), k = {top}", "same",
            _machine(r) + ", peak RSS of a child process per case",
            f"dense packed {above['dense-packed']:.2f} GiB (its LM-head logits over the prompt), without them "
            f"{above['dense-lean-packed']:.2f}; compressed packed {above['compressed-packed']:.2f}; one distillation "
            f"step {_x(r, f'{s}/k{top}/distill.working_bytes') / GiB:.2f} GiB, "
            f"{_x(r, f'{s}/k{top}/distill.seconds'):.1f} s", "—"]


def _builds(r: Record) -> list[str]:
    (s,) = r.config["shapes"]
    top = max(r.config["k"][s])

    def b(case: str, q: str) -> float:
        return _x(r, f"{s}/k{top}/build-{case}.{q}")

    return [f"the cache build alone, k = {top} ({b('dense', 'prompt_tokens')} tokens)", "same", _machine(r),
            f"dense {b('dense', 'flops') / 1e9:.0f} GFLOP, {b('dense', 'seconds'):.1f} s "
            f"(without the prompt's LM head {b('dense-lean', 'seconds'):.1f} s); compressed "
            f"{b('compressed', 'flops') / 1e9:.0f} GFLOP, {b('compressed', 'seconds'):.2f} s; the paper's "
            f"{b('paper-compressed', 'flops') / 1e9:.0f} GFLOP, {b('paper-compressed', 'seconds'):.2f} s", "—"]


def _gpu(r: Record) -> list[str]:
    return ["every paper shape (Qwen2.5-0.5B to 7B, Llama-3.1-8B, Gemma-3-1B) at k = 20, 50, 200 and the longest "
            "prompt, bfloat16", "`tools/gpu_scale.sh OUT`", "one GPU",
            "not yet measured (no GPU lent so far); the script is tested on tiny shapes on the CPU; FLOPs projected "
            "from the shapes: [cost at scale](docs/cost-at-scale.md#every-shape-projected)", "under 8 minutes"]


# BENCHMARKS' rows of the CPU record: what each says (measure, command, machine, measured, goal)
CPU_ROWS: dict[str, Callable[[Record], list[str]]] = {
    "k": _at_k, "paper": _paper, "per_query": _per_query, "memory": _memory, "builds": _builds, "gpu": _gpu}


def scale_cpu(records: Records) -> str:
    """BENCHMARKS' 'Selection cost at scale': the Qwen2.5-0.5B shape on the CPU, the GPU rows."""
    r = read(records, SCALE_CPU)
    link = cite(records, PAGES, SCALE_CPU)
    (s,) = r.config["shapes"]
    rows = ([_row(r.part(f"{s}/k{k}/saving"), "k") for k in r.config["k"][s]]
            + [_row(r, row) for row in ("paper", "per_query", "memory", "builds", "gpu")])

    def cells(row: Record) -> list[str]:
        return CPU_ROWS[row.config["row"]](row) + ["—" if row.config["row"] == "gpu" else link]

    return render(rows, [Column(h, cell=lambda row, i=i: cells(row)[i]) for i, h in enumerate(BENCH)])


def _evaluator(r: Record) -> str:
    note = f" ({r['queries_measured'].value} queries, scaled)" if "queries_measured" in r.metrics else ""
    return where(r)[2] + note


def _gib(x: float) -> str:
    return f"{x / GiB:.2f}"


MEASURED = [
    Column("shape", cell=lambda r: where(r)[0]), Column("k", metric="k", fmt="int"),
    Column("prompt tokens", metric="prompt_tokens", fmt="int"), Column("evaluator", cell=_evaluator),
    Column("GFLOP / subset", metric="flops_per_subset", fmt=lambda x: f"{x / 1e9:.1f}"),
    Column("s / subset", metric="seconds_per_subset", fmt=lambda x: f"{x:.2f}"),
    Column("peak GiB", metric="peak_bytes", fmt=_gib), Column("above weights GiB", metric="working_bytes", fmt=_gib),
    Column("FLOPs vs compressed", metric="flops_vs_compressed", fmt="ratio"),
    Column("time vs compressed", metric="seconds_vs_compressed", fmt="ratio"),
]


def scale_measured(records: Records) -> str:
    """docs/cost-at-scale.md: every measured row of the CPU records, per evaluated subset."""
    measured = [read(records, name) for name in (SCALE_SMOLLM2, SCALE_CPU)]
    return render([r.part(row) for r in measured for row in measured_rows(r)], MEASURED)


def _saving_or_dash(pair: str) -> Callable[[Record], str]:
    return lambda r: "—" if r[f"{pair}_flops"].value is None else f"{r[f'{pair}_flops'].value:.1f}x"


PROJECTED = [
    Column("shape", cell=lambda r: where(r)[0]), Column("k", metric="k", fmt="int"),
    Column("prompt tokens", metric="prompt_tokens", fmt="int"),
    Column("dense packed TFLOP", metric="flops.dense-packed", fmt=lambda x: f"{x / 1e12:.2f}"),
    Column("compressed packed TFLOP", metric="flops.compressed-packed", fmt=lambda x: f"{x / 1e12:.3f}"),
    Column("saving (recipe, 36 slots)", cell=_saving_or_dash("recipe")),
    Column("saving (paper, 20 slots)", cell=_saving_or_dash("paper")),
    Column("saving (window exact)", cell=_saving_or_dash("window")),
    Column("saving against the lean dense prefix", metric="lean_flops", fmt="ratio"),
    Column("saving against a prompt per query", metric="per_query_flops", fmt="ratio"),
]


def scale_projected(records: Records) -> str:
    """docs/cost-at-scale.md: FLOPs per evaluated subset projected from every shape."""
    r = read(records, SCALE_PROJECTED)
    return render([r.part(f"{s}/k{k}/projected") for s in r.config["shapes"] for k in r.config["k"][s]], PROJECTED)


def _how(r: Record) -> str:
    how = r.config["how"][r.config["part"]]
    if how["minutes"] == "measured":
        n = r["minutes"].n
        return f"minutes measured (the cold demo, {'one run' if n == 1 else f'the mean of {n} runs'}, 2 cores)"
    seconds = "measured" if how["seconds"] == "measured" else "projected (FLOPs / the 0.5B shape's FLOP/s)"
    return f"minutes projected, the dense subset {seconds}"


RUN_COLUMNS = [
    Column("model", config="part"), Column("parameters", metric="params", fmt=lambda x: f"{x / 1e9:.2f} B"),
    Column("weights GiB (float32 / bfloat16)",
           cell=lambda r: f"{r['weights_gib'].value:.1f} / {r['weights_gib_bf16'].value:.1f}"),
    Column("dense s / subset, k = 20 (1 thread)", metric="dense_seconds", fmt=lambda x: f"{x:.1f}"),
    Column("one demo `run`, minutes (CPU)", metric="minutes", fmt="int"),
    Column("one `run`, GiB (float32, from the shape)", metric="run_gib", fmt=lambda x: f"{x:.1f}"),
    Column("fits 24 GiB", cell=lambda r: "yes" if r["run_gib"].value <= 24 else "no"),
    Column("how", cell=_how),
]


def run_costs(records: Records) -> str:
    """docs/cost-at-scale.md: what one demo `icl-ssm run` costs per model size on the CPU, measured (the
    SmolLM2 demo) or projected from its non-search time by the ratio of dense seconds per subset
    (:func:`claim_tables.readers.scale.run_costs`), over the cold demos of the newest commit."""
    runs = [as_record(name, raw) for name, raw in records.glob("demo-cold-*.json")]
    newest = newest_runs(runs).config["names"]
    cpu = [read(records, name) for name in (SCALE_SMOLLM2, SCALE_CPU)]
    r = project_run_costs(read(records, SCALE_PROJECTED), cpu, [d for d in runs if d.name in newest])
    return render([r.part(s) for s in r.config["shapes"]], RUN_COLUMNS)


def scale_profile(records: Records) -> str:
    """docs/cost-at-scale.md: where one packed subset evaluation's seconds go (torch.profiler), per
    path: matrix products, attention and the rest, with the FLOPs each path is counted."""
    r = read(records, SCALE_PROFILE)
    c = r.config

    def path_or_saving(metric: str, show: str, saving: str | None = None) -> Callable[[Record], str]:
        def cell(row: Record) -> str:
            if row.config["part"] == "saving":
                return "" if saving is None else f"{row[saving].value:.1f}x"
            return format(row[metric].value, show)
        return cell

    columns = [
        Column(f"path ({c['shape']}, k = {c['k']}, {c['queries']} queries, {c['threads']} thread)",
               cell=lambda row: "dense / compressed" if row.config["part"] == "saving" else row.config["part"]),
        Column("GFLOP", cell=path_or_saving("gflops", ".0f", "flops")),
        Column("s", cell=path_or_saving("seconds", ".2f", "time")),
        Column("GFLOP/s", cell=path_or_saving("gflop_per_s", ".0f")),
        Column("matrix products, s", cell=lambda row: "" if row.config["part"] == "saving" else
               f"{row['matmul_seconds'].value:.2f} ({row['matmul_gflop_per_s'].value:.0f} GFLOP/s)"),
        Column("attention, s", cell=path_or_saving("attention_seconds", ".2f")),
        Column("the rest, s", cell=path_or_saving("other_seconds", ".2f")),
        Column("the rest, share", cell=path_or_saving("other_share", ".0%")),
    ]
    return render([r.part(path) for path in ("dense-packed", "compressed-packed", "saving")], columns)
