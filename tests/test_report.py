"""The report writer: every file from a full result dict, a minimal one without crashing,
atomic writes under failure, and the FLOP formatter. No model is involved."""

import json
import os

import pytest
from matplotlib.figure import Figure

from icl_ssm.report.figures import HANDED, _accuracy_fig, _cost_fig
from icl_ssm.report.markdown import _markdown, check_lines, verdict_lines
from icl_ssm.report.search import search_lines
from icl_ssm.report.values import _methods, format_flops
from icl_ssm.report.write import write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
METHODS = ("search (whole prompts)", "affinity", "affinity (dense)", "random", "bm25", "topk", "zero-shot")
LONG = ("affinity (dense's time)", "affinity (label-stratified, interleaved order)", "bridge (compressed caches)",
        "search (whole prompts, no screen)", "topk (sentence embeddings)")


def versus(mean, lo, hi, n=256):
    return {"mean": mean, "ci95": [lo, hi], "level": 0.95, "resampled": "rows", "n": n}


def checked(accuracy, at_or_above, vs, n=256):
    return {"indices": [1, 2, 3], "correct": [1] * round(accuracy * n) + [0] * (n - round(accuracy * n)),
            "accuracy": accuracy, "interval": [accuracy - 0.06, accuracy + 0.05], "beats_random": at_or_above / 16,
            "at_or_above": at_or_above, "vs_random": vs}


def sample_check(handed=None, preferred="search"):
    randoms = [{"indices": [i, i + 1, i + 2], "correct": [], "accuracy": 0.6 + 0.005 * i,
                "interval": [0.54, 0.66], "test_accuracy": 0.62 + 0.007 * i} for i in range(16)]
    prompts = {"search": checked(0.69, 14, versus(0.031, -0.010, 0.070)),
               "affinity": checked(0.66, 11, versus(0.010, -0.030, 0.050)),
               "zero-shot": {**checked(0.55, 0, versus(-0.09, -0.14, -0.04)), "indices": []}}
    handed = handed or {"name": "search", "indices": [3, 7, 11], "reason": "search scored 0.690 on 256 held-out "
                        "examples, at or above 14 of 16 random prompts (their mean 0.637); no checked prompt beats "
                        "it by more than the check can tell (the best, random-15: -0.015, simultaneous 95% lower "
                        "bound -0.071); kept", "replaced": False, "beats_random": 0.875, "at_or_above": 14,
                        "random_prompts": 16, "vs_random": versus(0.031, -0.010, 0.070), "shown_better": False,
                        "zero_shot_best": False, "test_accuracy": 0.733}
    return {"check_size": 256, "random": randoms, "random_mean": 0.6375, "random_median": 0.6375,
            "random_interval": [0.6, 0.675], "prompts": prompts, "preferred": preferred, "handed_over": handed,
            "zero_shot_test_accuracy": 0.56, "test_size": 150, "held_out": [64, 320]}


def sample_search(screen="compressed"):
    return {"screen": screen, "budget_seconds": 120.0, "wall_seconds": 118.4,
            "plan": {"screened": 400 if screen != "none" else 0, "arms": 16, "rungs": [[16, 8], [8, 16], [4, 32],
                                                                                       [2, 64]],
                     "orders": 4, "seconds": {"screen": 60.0, "confirm": 42.0, "order": 18.0},
                     "per_prompt": {"screen": 0.15, "prefix": 0.2, "per_query": 0.01}},
            "phases": {"pilot": 3.1, "screen": 58.2, "confirm": 40.3, "order": 16.8},
            "screened": 412 if screen != "none" else 0,
            "sources": {"random": 180, "balanced": 180, "swap": 46, "seed": 4, "affinity": 2},
            "screen_queries": 32, "confirm_queries": 64, "screen_split_half": 0.62, "screen_reliability": 0.77,
            "screen_vs_confirm_spearman": 0.45 if screen != "none" else None,
            "rungs": [{"arms": 16, "queries": 8, "losses": [0.61] * 16, "sources": ["swap"] + ["random"] * 15},
                      {"arms": 8, "queries": 16, "losses": [0.58] * 8, "sources": ["swap"] + ["random"] * 7},
                      {"arms": 4, "queries": 32, "losses": [0.55] * 4, "sources": ["swap", "seed", "random", "random"]},
                      {"arms": 2, "queries": 64, "losses": [0.512, 0.53], "sources": ["swap", "seed"]}],
            "winner_source": "swap", "winner_confirm_loss": 0.512,
            "order_search": {"chosen": 1, "flops": 0, "seconds": 16.0, "winner_loss": 0.512,
                             "candidates": [{"order": "score", "indices": [3, 7, 11], "validation_loss": 0.512},
                                            {"order": "interleave", "indices": [7, 3, 11], "validation_loss": 0.50}]}}


def sample_verdict(passed=True, evaluator=None):
    checks = [{"name": "ranks held-out subsets", "passed": passed, "value": 0.4, "ci95": [0.1, 0.6] if passed else
               [-0.1, 0.5], "detail": "subset-loss Spearman against the dense prompt 0.400 (95% CI over subsets "
               "[+0.100, +0.600]; needs a lower end above 0)"}]
    verdict = "compressed" if passed else "dense"
    summary = ("the compressed caches are faithful enough to the dense prompt (ranks held-out subsets: yes, ...), "
               "so affinity scores subsets on them") if passed else (
        "the compressed caches are not faithful enough to the dense prompt (ranks held-out subsets: no, ...), "
        "so affinity scores subsets on dense caches")
    return {"evaluator": evaluator or verdict, "verdict": verdict, "reason": None if passed else summary,
            "summary": summary, "checks": checks}


def full_report(extra_methods=()):
    sel = [
        dict(name="search", method="search (whole prompts)", evaluator=None, test_accuracy=0.733, test_size=150,
             test_accuracy_std=0.02, flops=0, wall_seconds=118.4, subsets=412, indices=[3, 7, 11]),
        dict(name="affinity", method="affinity", evaluator="compressed", test_accuracy=0.81, test_size=150,
             test_accuracy_std=0.012, flops=int(3.2e12), wall_seconds=41.5, subsets=256, indices=[3, 7, 12],
             dense_flops=int(9.6e13), dense_wall_seconds=812.0),
        dict(name="affinity-dense", method="affinity (dense)", evaluator="dense", test_accuracy=0.80, test_size=150,
             flops=int(9.6e13), wall_seconds=812.0, subsets=256, indices=[3, 8, 11]),
        dict(name="random", method="random", evaluator=None, test_accuracy=0.74, test_size=150,
             test_accuracy_std=0.03, flops=0, wall_seconds=0.01, subsets=None, indices=[1, 2, 3]),
        dict(name="bm25", method="bm25", evaluator=None, test_accuracy=0.77, test_size=150, flops=0,
             wall_seconds=0.2, subsets=None, indices=[4, 5, 6]),
        dict(name="topk", method="topk", evaluator="embedding", test_accuracy=0.79, test_size=150,
             flops=int(5e9), wall_seconds=1.7, subsets=None, indices=[7, 8, 9]),
    ]
    sel += [dict(name=f"extra-{i}", method=m, evaluator="compressed", test_accuracy=0.70 + 0.01 * i, test_size=150,
                 flops=int(1e12 * (i + 1)), wall_seconds=30.0 + i, subsets=64, indices=[i, i + 1, i + 2])
            for i, m in enumerate(extra_methods)]
    sel.append(dict(name="zero-shot", method="zero-shot", evaluator=None, test_accuracy=0.56, test_size=150, flops=0,
                    wall_seconds=None, indices=[]))
    fid = dict(rel_logit_err=0.0425, kl=0.0031, top1_agree=0.97, acc_dense=0.82, acc_compressed=0.80,
               subset_loss_spearman=0.91, subset_loss_spearman_ci95=[0.83, 0.95],
               flops_dense=int(1.1e12), flops_compressed=int(2.2e10),
               control_rel_logit_err=0.31, control_kl=0.12, control_top1_agree=0.71, control_subset_loss_spearman=0.2,
               subsets=64, queries=32)
    scores = [None if i % 5 == 0 else (i % 13) / 13 - 0.4 for i in range(200)]
    check = sample_check()
    picks = {s["name"]: s["indices"] for s in sel if s["name"] != "zero-shot"}
    return dict(model="smollm2-135m", task="rotten_tomatoes", k=20, seed=0, fidelity=fid, selections=sel,
                affinity_scores=scores, picks=picks, preferred="search", pool_size=200, check=check,
                handed_over=check["handed_over"], fidelity_verdict=sample_verdict(), search=sample_search(),
                prompt_file="prompt.txt", selected_file="selected.jsonl")


def minimal_report():
    sel = [dict(name="random", method="random", evaluator=None, test_accuracy=None, test_accuracy_std=None,
                flops=None, wall_seconds=None, subsets=None, indices=[])]
    return dict(model="tiny", task="toy", k=2, seed=None, selections=sel)


def leftovers(path):
    return sorted(p.name for p in path.iterdir() if p.name.startswith(".") or p.suffix == ".tmp")


def test_full_report_writes_every_file(tmp_path):
    report = full_report()
    snapshot = json.loads(json.dumps(report))
    paths = write_report(tmp_path / "out", report)
    assert set(paths) == {"markdown", "json", "accuracy", "cost"}
    assert report == snapshot  # the input is not modified
    for p in paths.values():
        assert p.is_file() and p.parent == tmp_path / "out"
    loaded = json.loads(paths["json"].read_text())
    plots = loaded.pop("plots")
    assert loaded == report
    assert plots == {"accuracy": "accuracy.png", "cost": "cost.png"}
    for name in plots:
        data = paths[name].read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    assert not (tmp_path / "out" / "affinity.png").exists()
    md = paths["markdown"].read_text()
    assert md.startswith("# smollm2-135m on rotten_tomatoes, k=20\n\nHanded over (prompt.txt): search (whole prompts)")
    for method in METHODS:
        assert f"| {method} |" in md
    for file in plots.values():
        assert f"]({file})" in md
    assert "[selected.jsonl](selected.jsonl)" in md and "[prompt.txt](prompt.txt)" in md
    assert "| compressed | 4.25% | 0.0031 | 0.970 | 0.910 [0.83, 0.95] |" in md
    assert "| control | 31.00% | 0.1200 | 0.710 | 0.200 |" in md  # no interval given: none shown
    assert "| window |" not in md  # window was not run
    assert "0.810 [0.74, 0.87] ± 0.012" in md and "3.20 TFLOP" in md and "96.00 TFLOP" in md and "30.0x fewer" in md
    assert "160 of 200 pool candidates" in md
    # the search scored prompts on the model without counting FLOPs: n/a, never 0
    search_row = next(line for line in md.splitlines() if line.startswith("| search (whole prompts) |"))
    assert "| n/a |" in search_row and "0 FLOP" not in search_row
    assert "| random |" in md and "| 0 FLOP |" in next(li for li in md.splitlines() if li.startswith("| random |"))
    # what prompt.txt holds and the pick the check judged, each named for what it is
    assert "- Handed over (prompt.txt): search (whole prompts), pool indices 3, 7, 11" in md
    assert "- Pick of search (whole prompts) (the prompt the check judged): pool indices 3, 7, 11" in md
    assert "Pool indices (affinity)" not in md
    assert "## Hand-over check" in md
    assert ("| search (whole prompts) **(handed over)** | 0.690 [0.63, 0.74] | 14 of 16 | +0.031 [-0.010, +0.070] "
            "| 0.733 [0.66, 0.80] |") in md
    assert "| random prompts (16) | mean 0.638, range 0.600-0.675 | — | — | median 0.673, range 0.620-0.725 |" in md
    assert "## Prompt search" in md
    assert "Fidelity verdict: The compressed caches are faithful enough to the dense prompt" in md
    assert "- Verdict check, ranks held-out subsets: yes," in md
    assert "gate" not in md.lower()
    assert leftovers(tmp_path / "out") == []


def test_order_averaged_accuracy_has_its_own_column(tmp_path):
    from icl_ssm.report.markdown import _selection_md

    rows = [dict(method="affinity", evaluator="compressed", test_accuracy=0.8, test_size=100,
                 test_accuracy_orders=[0.8, 0.7, 0.75, 0.65], test_accuracy_order_mean=0.725, test_accuracy_std=0.0645,
                 labels={"a": 2, "b": 1}),
            dict(method="zero", evaluator=None, test_accuracy=0.5, test_size=100)]
    md = "\n".join(_selection_md(rows))
    assert "| Mean over 4 orders ± sd |" in md and "| 0.725 ± 0.065 | a 2 / b 1 |" in md
    assert "0.800 [" in md and "0.800 [0.71, 0.87] ±" not in md


def test_minimal_report_renders_dashes(tmp_path):
    paths = write_report(tmp_path, minimal_report())
    assert set(paths) == {"markdown", "json", "accuracy", "cost"}
    assert not (tmp_path / "affinity.png").exists()
    assert json.loads(paths["json"].read_text())["plots"] == {"accuracy": "accuracy.png", "cost": "cost.png"}
    for name in ("accuracy", "cost"):
        assert paths[name].read_bytes().startswith(PNG_MAGIC)
    md = paths["markdown"].read_text()
    assert "Not measured." in md
    assert "| random | — | — | — | n/a | — | — |" in md  # no FLOP count: n/a, not 0
    assert "Dense-evaluator" not in md and "affinity.png" not in md


@pytest.mark.parametrize("extra", [dict(affinity_scores=[]), dict(affinity_scores=[None, 0.2]), dict(selections=[])])
def test_empty_optional_parts_still_plot(tmp_path, extra):
    paths = write_report(tmp_path, {**minimal_report(), **extra})
    assert "affinity" not in paths and not (tmp_path / "affinity.png").exists()  # affinity scores are not plotted
    assert paths["accuracy"].read_bytes().startswith(PNG_MAGIC) and paths["cost"].read_bytes().startswith(PNG_MAGIC)


def test_out_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "taken"
    target.write_text("x")
    with pytest.raises(ValueError, match="taken"):
        write_report(target, minimal_report())
    assert target.read_text() == "x"


@pytest.mark.parametrize(
    "bad, match",
    [(dict(selections="affinity"), "selections"),
     (dict(affinity_scores=[0.1, 0.2], picks={"search": [5]}), r"\[0, 2\)"),
     (dict(pool_size=4, handed_over={"name": "search", "indices": [1, 9]}), r"handed over.*\[9\].*\[0, 4\)"),
     (dict(check=[1]), "check")],
)
def test_invalid_report_is_refused_before_writing(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        write_report(tmp_path / "out", {**minimal_report(), **bad})
    assert not (tmp_path / "out").exists()


def test_non_json_value_leaves_nothing(tmp_path):
    with pytest.raises(TypeError):
        write_report(tmp_path, {**minimal_report(), "seed": object()})
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
        write_report(tmp_path, full_report())
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["accuracy.png"]  # complete, and written before the failure
    assert (tmp_path / "accuracy.png").read_bytes().startswith(PNG_MAGIC)


def test_replace_failure_keeps_previous_report(tmp_path, monkeypatch):
    write_report(tmp_path, full_report())
    before = (tmp_path / "report.md").read_text()
    real = os.replace

    def failing(src, dst):
        if str(dst).endswith("report.md"):
            raise OSError(5, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="Input/output"):
        write_report(tmp_path, {**minimal_report(), "model": "other"})
    assert (tmp_path / "report.md").read_text() == before
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "n, text",
    [(None, "—"), (0, "0 FLOP"), (999, "999 FLOP"), (1234, "1.23 kFLOP"), (3.2e12, "3.20 TFLOP"),
     (999_999, "1.00 MFLOP"), (5 * 10**9, "5.00 GFLOP"), (2.5e18, "2.50 EFLOP"), (3e21, "3000.00 EFLOP"),
     (float("nan"), "—"), (True, "—")],
)
def test_format_flops(n, text):
    assert format_flops(n) == text


# -- the hand-over check, the verdict and the search in words ------------------------------------


def test_check_lines_kept_pick_not_shown_better_than_random_prompts():
    lines = check_lines(full_report())
    assert lines[0] == ("Handed over (prompt.txt): search (whole prompts), the pick the check judged; test accuracy "
                        "0.733 [0.66, 0.80] on 150 test examples (zero-shot 0.560 [0.48, 0.64]).")
    assert lines[1] == ("Warning: the handed-over prompt is not shown to be better than a random prompt of the same "
                        "size: against the mean random prompt it scores +0.031 [-0.010, +0.070], an interval that does "
                        "not lie above 0.")
    assert lines[2] == ("On the 256 held-out check examples it scores at or above 14 of 16 random prompts of k=20; vs "
                        "the mean random prompt +0.031 [-0.010, +0.070] (95% paired bootstrap over the 256 check "
                        "examples).")
    assert lines[3].startswith("Why: search scored 0.690") and lines[3].endswith("; kept.")
    assert not any("replaced" in line or "zero-shot scored above" in line for line in lines)


def test_check_lines_shown_better_has_no_warning():
    report = full_report()
    report["check"]["handed_over"] = {**report["check"]["handed_over"], "shown_better": True,
                                      "vs_random": versus(0.06, 0.02, 0.10)}
    lines = check_lines(report)
    assert not any(line.startswith("Warning") for line in lines)
    assert "vs the mean random prompt +0.060 [+0.020, +0.100]" in lines[1]


def test_check_lines_say_when_the_pick_was_replaced():
    report = full_report()
    report["check"]["handed_over"] = {
        "name": "random-15", "indices": [15, 16, 17], "replaced": True, "reason": "search scored 0.600 ...; random-15 "
        "beats it by more than the check can tell (0.675: +0.075, simultaneous 95% lower bound +0.012), so random-15 "
        "is handed over (--keep-selection hands over the pick)", "beats_random": 1.0, "at_or_above": 15,
        "random_prompts": 15, "vs_random": versus(0.04, 0.01, 0.07), "shown_better": True, "zero_shot_best": False,
        "test_accuracy": 0.725}
    lines = check_lines(report)
    assert lines[0].startswith("Handed over (prompt.txt): random prompt #15, in place of the pick of search (whole "
                               "prompts); test accuracy 0.725 [")
    assert lines[1] == ("Warning: the pick of search (whole prompts) was replaced: random prompt #15 beat it on the "
                        "256 check examples by more than the check can tell, so prompt.txt holds random prompt #15 "
                        "(--keep-selection hands over the pick).")
    assert "not shown to be better" not in " ".join(lines)
    assert "at or above 15 of 15 other random prompts of k=20" in lines[2]  # compared with the others


def test_check_lines_warn_when_zero_shot_beats_every_k_shot_prompt():
    report = full_report()
    check = report["check"]
    check["prompts"]["zero-shot"]["accuracy"] = 0.70
    check["handed_over"] = {**check["handed_over"], "name": "zero-shot", "indices": [], "replaced": True,
                            "zero_shot_best": True, "test_accuracy": None}
    lines = check_lines(report)
    assert lines[0].startswith("Handed over (prompt.txt): zero-shot, in place of the pick of search (whole prompts); "
                               "test accuracy 0.560 [0.48, 0.64]")  # zero-shot's test accuracy
    assert ("Warning: zero-shot scored above every k-shot prompt checked on the 256 check examples (0.700 against at "
            "most 0.690): demonstrations may not help this model on this task.") in lines
    md = _markdown(report, {})
    assert "- Handed over (prompt.txt): zero-shot, pool indices none (zero-shot)" in md
    assert "| zero-shot **(handed over)** |" in md
    without_row = {**report, "selections": _methods(report)}  # no zero-shot row to take the title from
    assert check_lines(without_row)[0].startswith("Handed over (prompt.txt): zero-shot (no demonstrations), in ")


def test_check_lines_without_check_examples():
    report = full_report()
    report["check"] = {"skipped": True, "zero_shot_test_accuracy": 0.56, "test_size": 150}
    report["handed_over"] = {"name": "search", "indices": [3, 7, 11]}
    lines = check_lines(report)
    assert lines == ["Handed over (prompt.txt): search (whole prompts), the pick the check judged; test accuracy 0.733 "
                     "[0.66, 0.80] on 150 test examples (zero-shot 0.560 [0.48, 0.64]).",
                     "Warning: it was not checked against random prompts: no held-out validation examples were left "
                     "after selection."]
    assert check_lines({**report, "check": None}) == []
    assert "## Hand-over check" not in _markdown(report, {})


@pytest.mark.parametrize(
    "passed, evaluator, first, extra",
    [(True, None, "Fidelity verdict: The compressed caches are faithful enough to the dense prompt", None),
     (False, None, "Fidelity verdict: The compressed caches are not faithful enough to the dense prompt", None),
     (False, "compressed", "Warning: affinity selected on compressed caches that failed the fidelity verdict",
      "Fidelity verdict: The compressed caches are not faithful"),
     (True, "dense", "Fidelity verdict: The compressed caches are faithful", "Affinity evaluator: dense, because ")],
)
def test_verdict_lines_say_the_verdict_passed_or_failed(passed, evaluator, first, extra):
    verdict = sample_verdict(passed, evaluator)
    if evaluator and evaluator != verdict["verdict"] and passed:
        verdict["reason"] = "--evaluator dense was asked for; the fidelity verdict would have chosen compressed"
    lines = verdict_lines({"fidelity_verdict": verdict})
    assert lines[0].startswith(first)
    assert (extra is None and len(lines) == 1) or any(line.startswith(extra) for line in lines[1:])
    old = {k: v for k, v in verdict.items() if k != "summary"}  # a report from before the summary was kept
    said = " ".join(verdict_lines({"fidelity_verdict": old}))
    assert ("Fidelity verdict: The compressed caches " + ("are faithful" if passed else "are not faithful")) in said
    assert verdict_lines({}) == []
    assert not any("gate" in line.lower() for line in lines)


def test_search_section_says_what_each_number_rests_on():
    lines = search_lines(sample_search())
    text = "\n".join(lines)
    assert lines[0] == "Budget 120 s, took 118 s (pilot 3 s, screen 58 s, confirm 40 s, order 17 s)."
    assert ("- Plan: screen 400 prompts on the compressed caches (60 s, 0.15 s per prompt), confirm 16 on dense caches "
            "by successive halving (16 x 8 -> 8 x 16 -> 4 x 32 -> 2 x 64 prompts x queries, 42 s), order the survivor "
            "over 4 orders (18 s).") in lines
    assert ("- Screened: 412 prompts on the compressed caches, each on the same 32 label-balanced validation queries; "
            "candidates by source: random prompts 180, label-balanced random prompts 180, swaps and reorderings of the "
            "best screened 46, other methods' picks 4, Algorithm 2's top k from the screen's losses 2.") in lines
    assert ("- Screen reliability: split-half Spearman 0.62 between the prompts' losses on two halves of 16 queries, "
            "Spearman-Brown 0.77 for all 32; over the 412 screened prompts.") in lines
    assert ("- Screen vs dense confirmation: Spearman 0.45 between the screen's loss and the dense loss on the first "
            "rung's 8 queries, over its 16 prompts.") in lines
    winner = next(line for line in lines if line.startswith("- Winner"))
    assert winner == ("- Winner: from swaps and reorderings of the best screened, dense loss 0.512 on 64 queries; its "
                      "order chosen among 2 on the same queries: interleave (loss 0.500).")
    assert "| 4 | 2 | 64 | 0.512 | swap, seed |" in text
    assert "| 1 | 16 | 8 | 0.610 | swap, random, random, random, ... |" in text
    assert search_lines(None) == []
    assert "## Prompt search" not in _markdown({**full_report(), "search": None}, {})
    assert not any(line.startswith("- Stopped early") for line in lines)
    stopped = "the confirmation stopped before rung 4 of 4 (2 x 64q): it ran 1.48x the pilot's time"
    assert f"- Stopped early: {stopped}." in search_lines({**sample_search(), "stopped": stopped})


def test_search_section_without_a_screen_or_its_statistics():
    search = {**sample_search("none"), "screen_split_half": None, "screen_reliability": None}
    text = "\n".join(search_lines(search))
    assert "- Plan: no screen (random search), confirm 16 on dense caches" in text
    assert "- No screen: candidates went straight into the dense confirmation; by source: random prompts 180" in text
    assert "Screen reliability" not in text and "Spearman" not in text
    text = "\n".join(search_lines({**sample_search(), "screen_split_half": None, "screen_vs_confirm_spearman": None}))
    assert "- Screen reliability: not measured" in text and "- Screen vs dense confirmation: not measured" in text
    text = "\n".join(search_lines({"screen": "compressed"}))  # every key missing: dashes, no crash
    assert text.startswith("Budget — s, took — s.")


# -- figures -------------------------------------------------------------------------------------


def drawn(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def no_overlaps(texts, renderer):
    from matplotlib.text import Text

    boxes = [(t.get_text(), Text.get_window_extent(t, renderer)) for t in texts if t.get_text()]
    hits = [(a, b) for i, (a, x) in enumerate(boxes) for b, y in boxes[i + 1:] if x.overlaps(y)]
    assert not hits, f"overlapping labels: {hits}"
    return [t for t, _ in boxes]


def eight_methods():
    report = full_report(LONG[:2])  # six methods, two more with long names, and zero-shot
    assert len(_methods(report)) == 8
    return report


def test_accuracy_figure_has_a_row_per_method_and_marks_the_handed_over_prompt():
    report = eight_methods()
    fig = _accuracy_fig(report)
    renderer = drawn(fig)
    ax, twin = fig.axes
    names = no_overlaps(ax.get_yticklabels(), renderer)
    values = no_overlaps(twin.get_yticklabels(), renderer)
    assert names[0] == "search (whole prompts)" and "random prompts (16)" in names and len(names) == 9
    assert any("\n" in n for n in names)  # a long name wrapped rather than squeezing the axes
    assert "zero-shot" not in names  # a reference line, not a row
    assert values[0] == "0.733 [0.66, 0.80], handed over"
    assert ax.get_yticklabels()[0].get_color() == HANDED
    assert values[-1] == "median 0.673, 0.620-0.725"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "handed over (prompt.txt)" in legend and "zero-shot 0.560" in legend
    assert "150 test examples" in ax.get_title() and "k=20" in ax.get_title() and "smollm2-135m" in ax.get_title()


def test_accuracy_figure_marks_a_handed_over_random_prompt():
    report = eight_methods()
    report["check"]["handed_over"] = {**report["check"]["handed_over"], "name": "random-2", "replaced": True}
    fig = _accuracy_fig(report)
    drawn(fig)
    values = [t.get_text() for t in fig.axes[1].get_yticklabels()]
    assert values[-1].endswith(", one handed over") and not any(v.endswith(", handed over") for v in values)
    colours = [t.get_color() for t in fig.axes[0].get_yticklabels()]
    assert colours[-1] == HANDED and HANDED not in colours[:-1]


def test_cost_figure_labels_every_point_without_overlaps():
    report = eight_methods()
    fig = _cost_fig(report)
    renderer = drawn(fig)
    seconds, flops = fig.axes
    for ax in (seconds, flops):
        labels = no_overlaps(ax.texts, renderer)
        assert "search (whole prompts)\n(handed over)" in labels or "search (whole prompts) (handed over)" in labels \
            or ax is flops
    assert len(seconds.texts) == 8  # every method has a time
    flop_labels = " ".join(t.get_text() for t in flops.texts)
    assert "search" not in flop_labels and "random" not in flop_labels and "bm25" not in flop_labels
    note = flops.get_xlabel()
    assert "search (whole prompts) (FLOPs not counted)" in note.replace("\n", " ")
    assert "random, bm25 (0 FLOP)" in note.replace("\n", " ")
    assert seconds.get_xscale() == "log" and flops.get_xscale() == "log"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "handed over: search (whole prompts)" in legend


def test_crowded_cost_figure_falls_back_to_a_legend_of_the_methods():
    report = full_report(LONG + tuple(f"method number {i} with a long name" for i in range(10)))
    for s in report["selections"][6:-1]:  # fifteen methods on one point
        s.update(wall_seconds=30.0, test_accuracy=0.70, flops=int(1e12))
    report["check"]["handed_over"] = {**report["check"]["handed_over"], "name": "random-2", "replaced": True}
    fig = _cost_fig(report)
    drawn(fig)
    assert not fig.axes[0].texts and not fig.axes[1].texts  # no label beside a point
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(fig.legends) == 1 and "method number 9 with a long name" in legend and "search (whole prompts)" in legend
    assert "handed over: random prompt #2 (see accuracy.png)" in legend


def test_figures_with_nothing_measured_still_render(tmp_path):
    report = {**minimal_report(), "selections": []}
    for draw in (_accuracy_fig, _cost_fig):
        drawn(draw(report))
    fig = _cost_fig(minimal_report())
    drawn(fig)
    assert [t.get_text() for t in fig.axes[0].texts] == ["nothing to plot"]
