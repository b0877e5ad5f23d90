"""Calibration (docs/research/calibration.md): the label lean in the stored subset losses, the
headroom left after each calibration, and the pre-registered equal-time experiment."""

from __future__ import annotations

from claim_tables.base import Records, ci, pct, table

CALIBRATE = "calibration/calibrate-equal-time.json"


def label_lean(records: Records) -> str:
    data = records("calibration/label-lean-rotten_tomatoes.json")
    rows = []
    for r in data["records"]:
        if r.get("dense_same_as_or_nested_in"):
            continue  # the same dense losses as a record above
        by = {s["ranker"]: s for s in r["spearman"]}
        cells = []
        for name in ("recency-weighted label count, score^2 (w_i = i/k)", "plain label count, count^2",
                     "cache path: compressed", "cache path: control"):
            s = by.get(name)
            cells.append("-" if s is None else f"{s['spearman']:.2f} {ci(s['ci95'])}")
        rows.append([r["record"].split("/")[-1], str(r["k"]), f"{r['n_subsets']} x {r['n_queries']}",
                     f"{r['r2_quadratic']:.3f}", f"{r['r2_linear']:.3f}", *cells])
    header = ["record", "k", "subsets x queries", "R^2 quadratic in lean", "R^2 linear", "recency count^2",
              "plain count^2", "compressed", "control"]
    return (table(header, rows) + "\n\nSpearman against the label-balanced dense loss, 95% bootstrap intervals "
            f"over subsets. {records.link('calibration/label-lean-rotten_tomatoes.json', 2)}")


def calibration_headroom(records: Records, depth: int = 2) -> str:
    rows = []
    used = []
    for name, data in records.glob("calibration/headroom-*.json"):
        used.append(records.link(f"calibration/{name}", depth))
        cfg = data["config"]
        for task, t in data["tasks"].items():
            n = sum(t["test_labels"].values())
            for method, s in t["summary"].items():
                diff = s.get("best_minus_median")
                rows.append([task, str(cfg["seed"]), "-" if cfg["imbalance"] is None else f"{cfg['imbalance']:.0%}",
                             method, pct(s["zero_shot"]), f"{pct(s['median'])} ({pct(s['std'])})",
                             f"{pct(s['min'])}-{pct(s['max'])}",
                             "-" if "best_on_validation_test" not in s else pct(s["best_on_validation_test"]),
                             "-" if not diff else f"{100 * diff['mean']:+.1f} "
                                                  f"[{100 * diff['ci95'][0]:+.1f}, {100 * diff['ci95'][1]:+.1f}]",
                             _num(s.get("validation_test_spearman")), _num(s.get("validation_split_half")),
                             f"{len(s['test_accuracy'])} x {n}"])
    header = ["task", "split seed", "first label's share of test", "calibration", "zero-shot",
              "random prompts: median (sd)", "min-max", "best on validation: test",
              "best minus median [95% CI, test examples]", "validation-test Spearman", "validation split-half",
              "prompts x test examples"]
    return table(header, rows) + "\n\nAccuracies in %. " + ", ".join(used)


def calibrate_equal_time(records: Records, depth: int = 2) -> str:
    data = records(CALIBRATE)
    s = data["summary"]
    rows = []
    for name, e in s["arms"].items():
        vs = e.get("vs_best")
        rows.append([name, pct(e["mean"]), pct(e["raw_mean"]), str(e["runs"]), f"{e['wall_mean']:.0f}",
                     "best" if vs is None else f"{100 * vs['mean']:+.1f} [{100 * vs['ci95'][0]:+.1f}, "
                                               f"{100 * vs['ci95'][1]:+.1f}]"])
    d = s["decision"]
    text = table(["arm", "test accuracy (as handed over)", "raw", "runs", "mean wall s",
                  "minus the best [95% CI: runs x test examples]"], rows)
    text += f"\n\nRule: {d['why']}; `run`'s default: **{d['default']}**."
    c = d.get("cost_target")
    if c:
        text += (f" Cost target against {c['raw_search']}: accuracy {100 * c['accuracy_gap']:+.1f} points in "
                 f"{c['wall_ratio']:.2f}x its wall time: **{'met' if c['met'] else 'not met'}**.")
    return text + " " + records.link(CALIBRATE, depth)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


FIDELITY = "calibration/fidelity-calibrated-rotten_tomatoes-k20-32x64.json"


def calibrated_fidelity(records: Records) -> str:
    """Each cache path's subset ranking against the dense prompt, on the raw label-balanced loss and
    with the label lean removed (batch calibration per subset)."""
    data = records(FIDELITY)
    rows = []
    for name, prefix in (("compressed (shipped)", ""), ("control (prompt-independent)", "control_"),
                         ("window (same slots)", "window_")):
        cells = []
        for kind in ("balanced", "calibrated"):
            rho = data.get(f"{prefix}subset_loss_spearman_{kind}")
            interval = data.get(f"{prefix}subset_loss_spearman_{kind}_ci95_queries") or [None, None]
            cells.append("-" if rho is None else f"{rho:.2f}" + (f" {ci(interval)}" if None not in interval else ""))
        rows.append([name, *cells])
    text = table(["cache", "Spearman, raw balanced loss [95% CI]", "Spearman, lean removed [95% CI]"], rows)
    return (text + f"\n\n{data['subsets']} held-out subsets x {data['queries']} queries, k = {data['k']}; intervals "
            "resample subsets and queries. The dense ranking's own split-half: "
            f"{_num(data.get('dense_split_half_spearman_balanced'))} raw, "
            f"{_num(data.get('dense_split_half_spearman_calibrated'))} with the lean removed. "
            + records.link(FIDELITY, 2))


ALGORITHM2 = "calibration/algorithm2-calibrated-rotten_tomatoes-k20.json"


def algorithm2_calibrated(records: Records) -> str:
    """Algorithm 2's reliability on the raw label-balanced subset losses and on the batch-calibrated ones, from the
    same forward passes, seed by seed."""
    data = records(ALGORITHM2)
    rows = []
    for run in data["runs"]:
        for target, name in (("raw", "raw balanced loss"), ("batch", "lean removed (batch)")):
            t = run["targets"][target]
            need = t.get("subsets_for_0_8")
            rows.append([str(run["seed"]), name,
                         f"{t['subset_loss_split_half']:.2f} ({t['subset_loss_reliability']:.2f})",
                         f"{t['score_split_half']:.2f} ({t['score_reliability']:.2f})",
                         "never (split-half <= 0)" if need is None else str(need),
                         f"{t['score_label_spearman']:+.2f}",
                         str(run["top_k_overlap"]) if target == "batch" else "-"])
    first = data["runs"][0]
    return (table(["seed", "target", "subset losses: split-half (reliability)",
                   "candidates' scores: split-half (reliability)", "subsets for reliability 0.8",
                   "score vs the candidate's own label (Spearman)", f"top-{data['k']} picks shared with raw"], rows)
            + f"\n\n{first['subsets']} subsets x {first['queries']} validation queries a seed, k = {data['k']}, pool "
            f"{data['pool_size']}; both targets from the same dense forward passes. Split-halves: subset losses over "
            "label-stratified halves of the queries, candidates' scores over alternate permutation blocks of the "
            "subsets (Spearman; reliability by Spearman-Brown). " + records.link(ALGORITHM2, 2))
