"""``icl-ssm bench trust``: the handed-over prompt against random prompts, over tasks and seeds."""

import json

import numpy as np
import pytest
from icl_ssm_bench.trust import run_trust, summarize_run, summarize_trust, trust_markdown

from icl_ssm.data.tasks import get_task
from icl_ssm.pipeline import RunConfig


def rows_of(n: int, accuracies: dict[str, float]) -> dict[str, dict]:
    """Prompts on ``n`` test examples; a prompt of accuracy a answers the first n a right."""
    return {name: {"accuracy": a, "correct": [1] * round(n * a) + [0] * (n - round(n * a))}
            for name, a in accuracies.items()}


def test_summarize_run_places_the_handed_over_prompt_among_random_prompts_and_retrieval():
    plain = {f"plain-{i}": a for i, a in enumerate([0.5, 0.55, 0.6, 0.65, 0.7, 0.8])}
    balanced = {f"balanced-{i}": a for i, a in enumerate([0.7, 0.75, 0.9])}
    rows = rows_of(200, {**plain, **balanced, "handed-over": 0.75, "zero-shot": 0.5, "bm25": 0.7, "topk": 0.6,
                         "bm25 (per query)": 0.76})
    out = summarize_run(rows)
    assert out["plain"]["at_or_above"] == 5 and out["plain"]["count"] == 6 and out["balanced"]["at_or_above"] == 2
    assert out["plain"]["median"] == pytest.approx(0.625) and out["headroom"]["oracle"] == 0.8
    assert out["headroom"]["captured"] == pytest.approx((0.75 - 0.625) / (0.8 - 0.625))
    assert not out["at_or_above_retrieval"]  # per-query bm25 0.76 > 0.75
    vs = out["plain"]["vs_median_prompt"]  # the upper median prompt (0.65): +0.10 on 200 nested answers
    assert vs["mean"] == pytest.approx(0.10) and vs["ci95"][0] > 0 and out["plain"]["shown_better"]
    summary = summarize_trust([{**out, "task": "cr", "seed": 5, "search": None}])
    assert summary["at_or_above_three_quarters_plain"] == 1 and summary["at_or_above_retrieval"] == 0
    assert summary["shown_better_than_median_plain_rt_cr"] == 1 and summary["runs_rt_cr"] == 1
    md = trust_markdown([{**out, "task": "cr", "seed": 5, "handed_over": "search"}], summary)
    assert "| cr | 5 | search | 0.750 | 5/6 / 0.625 / 0.800 | 2/3 / 0.750 |" in md


def test_run_trust_on_a_tiny_model_reuses_the_first_compressor(tmp_path, tmp_cache):
    task = get_task("coin_flip", size=120)
    data = tmp_path / "coin.jsonl"
    data.write_text("".join(json.dumps({"text": e.input, "label": e.target}) + "\n" for e in task.examples()))
    base = RunConfig(model="tiny-llama", k=3, distill=True, state_size=16, num_virtual=4, num_sink=2, latent_size=8,
                     distill_samples=8, pool_size=24, queries=3, test_size=6, fidelity_subsets=4,
                     fidelity_queries=2, subsets=8, batch=4, test_orders=0, methods=("affinity", "random"),
                     check_size=8,
                     random_prompts=3,
                     dense_evaluator=False, evaluator="compressed")
    said = []
    result = run_trust([str(data)], [0, 1], tmp_path / "trust", random=3, base=base, say=said.append)
    rows = result["runs"]
    assert [(r["seed"], r["plain"]["count"], r["balanced"]["count"]) for r in rows] == [(0, 3, 3), (1, 3, 3)]
    record = json.loads((tmp_path / "trust" / "records" / "coin-s0.json").read_text())
    assert record["environment"]["commit"] and record["config"]["seed"] == 0 and record["check"]["reason"]
    assert set(record["prompts_on_test"]) >= {"handed-over", "zero-shot", "plain-0", "balanced-2", "bm25 (per query)"}
    assert all(len(r["correct"]) == 6 for r in record["prompts_on_test"].values())
    first = json.loads((tmp_path / "trust" / "coin-s0" / "report.json").read_text())["compressor"]
    second = json.loads((tmp_path / "trust" / "coin-s1" / "report.json").read_text())["compressor"]
    assert first["source"] == "distilled" and second == {**second, "source": "given",
                                                         "compressor": first["compressor"]}
    md = (tmp_path / "trust" / "trust.md").read_text()
    assert "Handed-over prompt at or above 3/4 of the plain random prompts" in md
    assert len(said) == 2 and result["summary"]["runs"] == 2
    again = run_trust([str(data)], [0, 1], tmp_path / "trust", random=3, base=base, say=said.append)
    assert again["runs"] == rows and len(said) == 2  # finished runs are read back, not redone
    # a finished run whose compressor has gone (the checkout moved) does not lend that path to the next seed
    stored = tmp_path / "trust" / "records" / "coin-s0.json"
    moved = json.loads(stored.read_text())
    moved["compressor"] = str(tmp_path / "gone" / "compressor")
    stored.write_text(json.dumps(moved))
    third = run_trust([str(data)], [0, 2], tmp_path / "trust", random=3, base=base, say=said.append)
    assert [r["seed"] for r in third["runs"]] == [0, 2] and len(said) == 3
    s2 = json.loads((tmp_path / "trust" / "coin-s2" / "report.json").read_text())
    assert s2["compressor"]["source"] == "distilled"


def test_a_tie_in_correct_answers_counts_as_at_the_other_prompt():
    """314 of 400 right for both: a float32 accuracy (0.78500003) must not rank above the
    handed-over prompt's 0.785."""
    n = 400
    rows = rows_of(n, {"plain-0": 0.785, "plain-1": 0.5, "balanced-0": 0.785, "handed-over": 0.785,
                       "zero-shot": 0.5, "topk": 0.785})
    for name in ("plain-0", "balanced-0", "topk"):
        rows[name]["accuracy"] = float(np.float32(0.785))  # as evaluate_selection reports it
    out = summarize_run(rows)
    assert out["plain"]["at_or_above"] == 2 and out["balanced"]["at_or_above"] == 1
    assert out["at_or_above_retrieval"]


def test_a_calibrating_run_is_judged_as_handed_over_beside_calibrated_random_prompts(tmp_path, tmp_cache):
    task = get_task("coin_flip", size=120)
    data = tmp_path / "coin.jsonl"
    data.write_text("".join(json.dumps({"text": e.input, "label": e.target}) + "\n" for e in task.examples()))
    base = RunConfig(model="tiny-llama", k=3, pool_size=24, queries=3, test_size=6, batch=4, methods=("search",),
                     search_minutes=0.1, screen_queries=4, confirm_queries=8, check_size=8, random_prompts=3,
                     calibrate="search", headroom=False)
    result = run_trust([str(data)], [0], tmp_path / "trust", random=3, base=base, say=lambda line: None)
    record = result["runs"][0]
    rows = record["prompts_on_test"]
    assert {"calibrated plain-0", "calibrated balanced-2", "calibrated zero-shot", "handed-over (raw)"} <= set(rows)
    assert rows["calibrated plain-1"]["calibration"]["method"] == "batch"
    assert record["calibrated_plain"]["count"] == 3 and "vs_calibrated_zero_shot" in record
    assert record["handed_test_accuracy"] == np.mean(rows["handed-over"]["correct"])
    assert len(record["test_ids"]) == 6 and record["scored_on_test_by"]["commit"]
    assert {"select-search", "check"} <= set(record["stages_made_by"])
    assert all(m["machine"] and "modified_files" in m for m in record["stages_made_by"].values())
