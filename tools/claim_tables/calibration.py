"""Calibration (docs/research/calibration.md): the label lean in the stored subset losses, the
headroom left after each calibration, and the pre-registered equal-time experiment.

Every table renders through the one renderer over records read through the one adapter; a row that is one part
of a stored record (a stored subset-loss record, an arm, a seed and target) reads its own settings from
``config["parts"]`` (:mod:`claim_tables.readers.calibration`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from claim_tables.adapt import as_record, read
from claim_tables.base import Records, pct
from claim_tables.render import FORMATS, Column, intervals_note, metric_text, render
from icl_ssm.records import Record

CALIBRATE = "calibration/calibrate-equal-time.json"
LEAN = "calibration/label-lean-rotten_tomatoes.json"
FIDELITY = "calibration/fidelity-calibrated-rotten_tomatoes-k20-32x64.json"
ALGORITHM2 = "calibration/algorithm2-calibrated-rotten_tomatoes-k20.json"


def setting(r: Record, key: str) -> Any:
    """A row's own setting: the part's in ``config["parts"]``."""
    return r.config["parts"][r.config["part"]][key]


def parts(r: Record) -> list[Record]:
    return [r.part(p) for p in r.config["parts"]]


LEAN_COLUMNS = [
    Column("record", cell=lambda r: setting(r, "record").split("/")[-1]),
    Column("k", cell=lambda r: str(setting(r, "k"))),
    Column("subsets x queries", cell=lambda r: f"{setting(r, 'subsets')} x {setting(r, 'queries')}"),
    Column("R^2 quadratic in lean", "r2_quadratic", fmt=lambda x: f"{x:.3f}"),
    Column("R^2 linear", "r2_linear", fmt=lambda x: f"{x:.3f}"),
    Column("recency count^2", "spearman.recency_count2", fmt="rho"),
    Column("plain count^2", "spearman.count2", fmt="rho"),
    Column("compressed", "spearman.compressed", fmt="rho"), Column("control", "spearman.control", fmt="rho"),
]


def label_lean(records: Records) -> str:
    """Per stored subset-loss record (not one repeating another's dense losses): the lean's R^2 and the rankers."""
    rows = [r for r in parts(read(records, LEAN)) if not setting(r, "dense_same_as_or_nested_in")]
    return (render(rows, LEAN_COLUMNS) + "\n\nSpearman against the label-balanced dense loss, 95% bootstrap "
            f"intervals over subsets. {records.link(LEAN, 2)}")


def _headroom_rows(records: Records) -> tuple[list[Record], list[str]]:
    """Each headroom record's tasks, one at a time (the headroom reader reads a record of one task), as one row
    per calibration; and the links."""
    rows, used = [], []
    for name, raw in records.glob("calibration/headroom-*.json"):
        used.append(f"calibration/{name}")
        for task, t in raw["tasks"].items():
            record = as_record(f"calibration/{name}", {**raw, "tasks": {task: t}})
            methods = list(dict.fromkeys(k.split(".")[0] for k in record.metrics if k.endswith(".median")))
            rows += [record.part(m) for m in methods]
    return rows, used


def _spread(r: Record) -> str:
    return f"{pct(r['median'].value)} ({pct(r['sd'].value)})"


def calibration_headroom(records: Records, depth: int = 2) -> str:
    rows, used = _headroom_rows(records)
    columns = [
        Column("task", config="task"), Column("split seed", config="seed"),
        Column("first label's share of test",
               cell=lambda r: "-" if r.config["imbalance"] is None else f"{r.config['imbalance']:.0%}"),
        Column("calibration", config="part"), Column("zero-shot", "zero_shot", fmt="pct"),
        Column("random prompts: median (sd)", cell=_spread),
        Column("min-max", cell=lambda r: f"{pct(r['min'].value)}-{pct(r['max'].value)}"),
        Column("best on validation: test", "best_test", fmt="pct"),
        Column("best minus median [95% CI, test examples]", "best_minus_median", fmt="points"),
        Column("validation-test Spearman", "spearman", fmt="rho"),
        Column("validation split-half", "split_half", fmt="rho"),
        Column("prompts x test examples", cell=lambda r: f"{r['sd'].n} x {r['median'].n}"),
    ]
    return (render(rows, columns) + "\n\nAccuracies in %. "
            + ", ".join(records.link(name, depth) for name in used))


def _minus_best(r: Record) -> str:
    return "best" if r.config["part"] == r.config["decision"]["best"] else metric_text(r["vs_best"], FORMATS["points"])


CALIBRATE_COLUMNS = [
    Column("arm", config="part"), Column("test accuracy (as handed over)", "accuracy", fmt="pct"),
    Column("raw", "raw", fmt="pct"), Column("runs", "runs", fmt="int"), Column("mean wall s", "wall_mean", fmt="int"),
    Column("minus the best [95% CI: runs x test examples]", cell=_minus_best),
]


def calibrate_equal_time(records: Records, depth: int = 2) -> str:
    record = read(records, CALIBRATE)
    rows = parts(record)
    # the 'minus the best' cell says "best" for the best arm, so the renderer's intervals line names it here
    note = intervals_note(rows, [Column(CALIBRATE_COLUMNS[-1].header, "vs_best", fmt="points")])
    d = record.config["decision"]
    text = render(rows, CALIBRATE_COLUMNS) + f"\n\n{note}\n\nRule: {d['why']}; `run`'s default: **{d['default']}**."
    c = d.get("cost_target")
    if c:
        text += (f" Cost target against {c['against']}: accuracy {100 * record['cost.accuracy_gap'].value:+.1f} "
                 f"points in {record['cost.wall_ratio'].value:.2f}x its wall time: "
                 f"**{'met' if c['met'] else 'not met'}**.")
    return text + " " + records.link(CALIBRATE, depth)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


FIDELITY_COLUMNS = [
    Column("cache", cell=lambda r: {"compressed": "compressed (shipped)", "control": "control (prompt-independent)",
                                    "window": "window (same slots)"}[r.config["part"]]),
    Column("Spearman, raw balanced loss [95% CI]", "spearman_balanced", fmt="rho"),
    Column("Spearman, lean removed [95% CI]", "spearman_calibrated", fmt="rho"),
]


def calibrated_fidelity(records: Records) -> str:
    """Each cache path's subset ranking against the dense prompt, on the raw label-balanced loss and
    with the label lean removed (batch calibration per subset)."""
    record = read(records, FIDELITY)
    rows = [record.part(c) for c in ("compressed", "control", "window")]
    cfg = record.config
    return (render(rows, FIDELITY_COLUMNS)
            + f"\n\n{cfg['subsets']} held-out subsets x {cfg['queries']} queries, k = {cfg['k']}; intervals "
            "resample subsets and queries. The dense ranking's own split-half: "
            f"{_num(record['dense.split_half_balanced'].value)} raw, "
            f"{_num(record['dense.split_half_calibrated'].value)} with the lean removed. "
            + records.link(FIDELITY, 2))


TARGETS = {"raw": "raw balanced loss", "batch": "lean removed (batch)"}


def _with_reliability(kind: str) -> Callable[[Record], str]:
    return lambda r: f"{r[f'{kind}_split_half'].value:.2f} ({r[f'{kind}_reliability'].value:.2f})"


def _subsets_needed(r: Record) -> str:
    need = r["subsets_for_0_8"].value
    return "never (split-half <= 0)" if need is None else f"{need:.0f}"


def algorithm2_calibrated(records: Records) -> str:
    """Algorithm 2's reliability on the raw label-balanced subset losses and on the batch-calibrated ones, from the
    same forward passes, seed by seed."""
    record = read(records, ALGORITHM2)
    rows = [r for r in parts(record) if setting(r, "target") in TARGETS]
    k = record.config["k"]
    columns = [
        Column("seed", cell=lambda r: str(setting(r, "seed"))),
        Column("target", cell=lambda r: TARGETS[setting(r, "target")]),
        Column("subset losses: split-half (reliability)", cell=_with_reliability("subset_loss")),
        Column("candidates' scores: split-half (reliability)", cell=_with_reliability("score")),
        Column("subsets for reliability 0.8", cell=_subsets_needed),
        Column("score vs the candidate's own label (Spearman)", "score_label_spearman", fmt=lambda x: f"{x:+.2f}"),
        Column(f"top-{k} picks shared with raw", "top_k_shared_with_raw", fmt="int"),
    ]
    first = rows[0]
    return (render(rows, columns)
            + f"\n\n{setting(first, 'subsets')} subsets x {setting(first, 'queries')} validation queries a seed, "
            f"k = {k}, pool {record.config['pool_size']}; both targets from the same dense forward passes. "
            "Split-halves: subset losses over label-stratified halves of the queries, candidates' scores over "
            "alternate permutation blocks of the subsets (Spearman; reliability by Spearman-Brown). "
            + records.link(ALGORITHM2, 2))
