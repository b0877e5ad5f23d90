"""``icl-ssm bench trust``: the handed-over prompt against random prompts, over tasks and seeds."""

import json

import pytest

from icl_ssm.bench.trust import run_trust, summarize_trust, trust_markdown, trust_row
from icl_ssm.data.tasks import get_task
from icl_ssm.pipeline import RunConfig


def report(handed_acc, beats, method_acc=0.6):
    return {"task": "t", "seed": 0, "k": 4,
            "handed_over": {"name": "random-1", "indices": [1, 2], "test_accuracy": handed_acc, "beats_random": beats},
            "check": {"zero_shot_test_accuracy": 0.5, "test_size": 100},
            "selections": [{"method": "affinity", "evaluator": "compressed", "test_accuracy": method_acc,
                            "indices": [3, 4]}], "gate": {"verdict": "compressed"}}


def test_trust_row_places_the_handed_over_prompt_among_the_random_ones():
    random = [0.5, 0.6, 0.7, 0.8]  # median 0.65, 25th percentile 0.575
    row = trust_row(report(0.7, beats=False), random, 12.0)
    assert row["random_median"] == pytest.approx(0.65) and row["random_p25"] == pytest.approx(0.575)
    assert row["at_or_above_median"] and not row["below_p25"] and row["warned"]
    assert not row["method_at_or_above_median"]  # 0.6 < 0.65
    low = trust_row(report(0.55, beats=True), random, 12.0)
    assert low["below_p25"] and not low["warned"] and not low["at_or_above_median"]
    summary = summarize_trust([row, low])
    assert summary == {"runs": 2, "handed_at_or_above_median": 1, "handed_below_p25": 1,
                       "handed_below_p25_unwarned": 1, "method_at_or_above_median": 0, "warned": 1}
    md = trust_markdown([row, low], summary)
    assert "| t | 0 | random-1 | 0.700 | 0.600 (compressed) | 0.650 [0.575] | 0.500 | yes |" in md
    assert "at or above the median random prompt: 1 of 2 runs; below the 25th percentile: 1 (1 without" in md


def test_run_trust_on_a_tiny_model_reuses_the_first_compressor(tmp_path, tmp_cache):
    task = get_task("coin_flip", size=120)
    data = tmp_path / "coin.jsonl"
    data.write_text("".join(json.dumps({"text": e.input, "label": e.target}) + "\n" for e in task.examples()))
    base = RunConfig(model="tiny-llama", k=3, state_size=16, num_virtual=4, num_sink=2, latent_size=8,
                     distill_samples=8, pool_size=24, queries=3, test_size=6, fidelity_subsets=4,
                     fidelity_queries=2, subsets=8, batch=4, test_orders=0, methods=("affinity", "random"),
                     dense_evaluator=False, evaluator="compressed")
    said = []
    result = run_trust([str(data)], [0, 1], tmp_path / "trust", random=3, base=base, say=said.append)
    rows = result["runs"]
    assert [(r["seed"], len(r["random_test_accuracies"])) for r in rows] == [(0, 3), (1, 3)]
    first = json.loads((tmp_path / "trust" / "coin-s0" / "report.json").read_text())["compressor"]
    second = json.loads((tmp_path / "trust" / "coin-s1" / "report.json").read_text())["compressor"]
    assert first["source"] == "distilled" and second == {**second, "source": "given",
                                                         "compressor": first["compressor"]}
    assert "Handed-over prompt at or above the median random prompt:" in (tmp_path / "trust" / "trust.md").read_text()
    assert len(said) == 2 and result["summary"]["runs"] == 2
    again = run_trust([str(data)], [0, 1], tmp_path / "trust", random=3, base=base, say=said.append)
    assert again["runs"] == rows and len(said) == 2  # finished runs are read back, not redone
    # a finished run whose compressor has gone (the checkout moved) does not lend that path to the next seed
    stored = tmp_path / "trust" / "coin-s0" / "report.json"
    moved = json.loads(stored.read_text())
    moved["compressor"]["compressor"] = str(tmp_path / "gone" / "compressor")
    stored.write_text(json.dumps(moved))
    third = run_trust([str(data)], [0, 2], tmp_path / "trust", random=3, base=base, say=said.append)
    assert [r["seed"] for r in third["runs"]] == [0, 2] and len(said) == 3
    s2 = json.loads((tmp_path / "trust" / "coin-s2" / "report.json").read_text())
    assert s2["compressor"]["source"] == "distilled"


def test_rehandover_script_applies_todays_rule_to_stored_checks(tmp_path, capsys):
    """research/rehandover.py on a planted trust run: a pick below the median that no prompt beats
    by more than the check can tell is kept by today's rule."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "research" / "rehandover.py"
    spec = importlib.util.spec_from_file_location("rehandover", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    def row(indices, hits):
        return {"indices": indices, "accuracy": hits / 40, "correct": [1.0] * hits + [0.0] * (40 - hits)}

    check = {"check_size": 40, "random_median": 0.5, "preferred": "affinity",
             "prompts": {"affinity": {**row([1, 2], 19), "vs_median_interval": [-0.2, 0.1]},
                         "zero-shot": row([], 20)},
             "random": [row([3, 4], 18), row([5, 6], 20), row([7, 8], 21)]}
    run = tmp_path / "t-s0"
    (run / "stages").mkdir(parents=True)
    (run / "stages" / "check.json").write_text(json.dumps({"key": "k", "result": check}))
    (run / "report.json").write_text(json.dumps({
        "selections": [{"method": "affinity", "indices": [1, 2], "test_accuracy": 0.61}],
        "handed_over": {"name": "random-2", "indices": [7, 8]}}))
    (tmp_path / "trust.json").write_text(json.dumps({"runs": [
        {"task": "t", "seed": 0, "handed_over": "random-2", "handed_test_accuracy": 0.55,
         "random_test_accuracies": [0.5, 0.6, 0.58, 0.62]}]}))
    [out] = script.main(str(tmp_path))
    assert (out["then"], out["now"], out["test_accuracy"]) == ("random-2", "affinity", 0.61)
    assert out["at_or_above_median"] and not out["below_p25"] and "kept" in out["reason"] and out["warned"]
