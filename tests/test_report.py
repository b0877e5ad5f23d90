"""The report writer: every file from a full result dict, a minimal one without crashing,
atomic writes under failure, and the FLOP formatter. No model is involved."""

import json
import os

import pytest
from matplotlib.figure import Figure

from icl_ssm import report as R

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
METHODS = ("affinity", "random", "bm25", "topk")


def full_report():
    sel = [
        dict(method="affinity", evaluator="compressed", test_accuracy=0.81, test_accuracy_std=0.012, flops=int(3.2e12),
             wall_seconds=41.5, subsets=256, indices=[3, 7, 11], dense_flops=int(9.6e13), dense_wall_seconds=812.0),
        dict(method="random", evaluator=None, test_accuracy=0.74, test_accuracy_std=0.03, flops=0,
             wall_seconds=0.01, subsets=None, indices=[1, 2, 3], dense_flops=None, dense_wall_seconds=None),
        dict(method="bm25", evaluator=None, test_accuracy=0.77, test_accuracy_std=None, flops=0,
             wall_seconds=0.2, subsets=None, indices=[4, 5, 6], dense_flops=None, dense_wall_seconds=None),
        dict(method="topk", evaluator="embedding", test_accuracy=0.79, test_accuracy_std=None, flops=int(5e9),
             wall_seconds=1.7, subsets=None, indices=[7, 8, 9], dense_flops=None, dense_wall_seconds=None),
    ]
    fid = dict(rel_logit_err=0.0425, kl=0.0031, top1_agree=0.97, acc_dense=0.82, acc_compressed=0.80,
               subset_loss_spearman=0.91, subset_loss_spearman_ci95=[0.83, 0.95],
               flops_dense=int(1.1e12), flops_compressed=int(2.2e10),
               control_rel_logit_err=0.31, control_kl=0.12, control_top1_agree=0.71, control_subset_loss_spearman=0.2,
               subsets=64, queries=32)
    scores = [None if i % 5 == 0 else (i % 13) / 13 - 0.4 for i in range(200)]
    return dict(model="smollm2-135m", task="rotten_tomatoes", k=20, seed=0, fidelity=fid, selections=sel,
                affinity_scores=scores, selected=[3, 7, 11], prompt_file="prompt.txt", selected_file="selected.jsonl")


def minimal_report():
    sel = [dict(method="random", evaluator=None, test_accuracy=None, test_accuracy_std=None, flops=None,
                wall_seconds=None, subsets=None, indices=[])]
    return dict(model="tiny", task="toy", k=2, seed=None, selections=sel)


def leftovers(path):
    return sorted(p.name for p in path.iterdir() if p.name.startswith(".") or p.suffix == ".tmp")


def test_full_report_writes_every_file(tmp_path):
    report = full_report()
    snapshot = json.loads(json.dumps(report))
    paths = R.write_report(tmp_path / "out", report)
    assert set(paths) == {"markdown", "json", "accuracy", "cost", "affinity"}
    assert report == snapshot  # the input is not modified
    for p in paths.values():
        assert p.is_file() and p.parent == tmp_path / "out"
    loaded = json.loads(paths["json"].read_text())
    plots = loaded.pop("plots")
    assert loaded == report
    assert plots == {"accuracy": "accuracy.png", "cost": "cost.png", "affinity": "affinity.png"}
    for name in plots:
        data = paths[name].read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    md = paths["markdown"].read_text()
    assert md.startswith("# smollm2-135m on rotten_tomatoes, k=20")
    for method in METHODS:
        assert f"| {method} |" in md
    for file in plots.values():
        assert f"]({file})" in md
    assert "[selected.jsonl](selected.jsonl)" in md and "[prompt.txt](prompt.txt)" in md
    assert "| compressed | 4.25% | 0.0031 | 0.970 | 0.910 [0.83, 0.95] |" in md
    assert "| control | 31.00% | 0.1200 | 0.710 | 0.200 |" in md  # no interval given: none shown
    assert "| window |" not in md  # window was not run
    assert "0.810 ± 0.012" in md and "3.20 TFLOP" in md and "96.00 TFLOP" in md and "30.0x fewer" in md
    assert "160 of 200 pool candidates" in md
    assert leftovers(tmp_path / "out") == []


def test_order_averaged_accuracy_has_its_own_column(tmp_path):
    from icl_ssm.report import _selection_md

    rows = [dict(method="affinity", evaluator="compressed", test_accuracy=0.8, test_size=100,
                 test_accuracy_orders=[0.8, 0.7, 0.75, 0.65], test_accuracy_order_mean=0.725, test_accuracy_std=0.0645,
                 labels={"a": 2, "b": 1}),
            dict(method="zero", evaluator=None, test_accuracy=0.5, test_size=100)]
    md = "\n".join(_selection_md(rows))
    assert "| Mean over 4 orders ± sd |" in md and "| 0.725 ± 0.065 | a 2 / b 1 |" in md
    assert "0.800 [" in md and "0.800 [0.71, 0.87] ±" not in md


def test_minimal_report_renders_dashes(tmp_path):
    paths = R.write_report(tmp_path, minimal_report())
    assert set(paths) == {"markdown", "json", "accuracy", "cost"}
    assert not (tmp_path / "affinity.png").exists()
    assert json.loads(paths["json"].read_text())["plots"] == {"accuracy": "accuracy.png", "cost": "cost.png"}
    for name in ("accuracy", "cost"):
        assert paths[name].read_bytes().startswith(PNG_MAGIC)
    md = paths["markdown"].read_text()
    assert "Not measured." in md
    assert "| random | — | — | — | — | — |" in md
    assert "Dense-evaluator" not in md and "affinity.png" not in md


@pytest.mark.parametrize("extra", [dict(affinity_scores=[]), dict(affinity_scores=[None, None]), dict(selections=[])])
def test_empty_optional_parts_skip_plots(tmp_path, extra):
    paths = R.write_report(tmp_path, {**minimal_report(), **extra})
    assert "affinity" not in paths and not (tmp_path / "affinity.png").exists()
    assert paths["cost"].read_bytes().startswith(PNG_MAGIC)


def test_out_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "taken"
    target.write_text("x")
    with pytest.raises(ValueError, match="taken"):
        R.write_report(target, minimal_report())
    assert target.read_text() == "x"


@pytest.mark.parametrize(
    "bad, match",
    [(dict(selections="affinity"), "selections"), (dict(affinity_scores=[0.1, 0.2], selected=[5]), r"\[0, 2\)")],
)
def test_invalid_report_is_refused_before_writing(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        R.write_report(tmp_path / "out", {**minimal_report(), **bad})
    assert not (tmp_path / "out").exists()


def test_non_json_value_leaves_nothing(tmp_path):
    with pytest.raises(TypeError):
        R.write_report(tmp_path, {**minimal_report(), "seed": object()})
    assert list(tmp_path.iterdir()) == []


def test_savefig_failure_leaves_no_partial_file(tmp_path, monkeypatch):
    real = Figure.savefig
    calls = []

    def flaky(self, fname, **kw):
        calls.append(1)
        if len(calls) == 2:  # the cost plot: half a PNG, then the disk is full
            fname.write(PNG_MAGIC + b"\0" * 100)
            raise OSError(28, "No space left on device")
        return real(self, fname, **kw)

    monkeypatch.setattr(Figure, "savefig", flaky)
    with pytest.raises(OSError, match="No space"):
        R.write_report(tmp_path, full_report())
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["accuracy.png"]  # complete, and written before the failure
    assert (tmp_path / "accuracy.png").read_bytes().startswith(PNG_MAGIC)


def test_replace_failure_keeps_previous_report(tmp_path, monkeypatch):
    R.write_report(tmp_path, full_report())
    before = (tmp_path / "report.md").read_text()
    real = os.replace

    def failing(src, dst):
        if str(dst).endswith("report.md"):
            raise OSError(5, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="Input/output"):
        R.write_report(tmp_path, {**minimal_report(), "model": "other"})
    assert (tmp_path / "report.md").read_text() == before
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "n, text",
    [(None, "—"), (0, "0 FLOP"), (999, "999 FLOP"), (1234, "1.23 kFLOP"), (3.2e12, "3.20 TFLOP"),
     (999_999, "1.00 MFLOP"), (5 * 10**9, "5.00 GFLOP"), (2.5e18, "2.50 EFLOP"), (3e21, "3000.00 EFLOP"),
     (float("nan"), "—"), (True, "—")],
)
def test_format_flops(n, text):
    assert R.format_flops(n) == text
