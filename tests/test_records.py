"""The record schema (icl_ssm.records), the one adapter from older records and the one renderer."""

import json
import math
import sys
from pathlib import Path

import pytest

from icl_ssm.records import SCHEMA, Metric, Record, read_record, write_record

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from claim_tables.adapt import as_record  # noqa: E402
from claim_tables.render import Column, intervals_note, render  # noqa: E402

MADE = {"check": {"commit": "a" * 40, "date": "2026-11-28", "machine": "x86_64, 2 torch threads, cpu"}}


def test_a_metric_says_what_its_interval_rests_on_and_refuses_what_is_not_one():
    m = Metric(0.1, (-0.02, 0.2), 400, "test examples", "accuracy difference")
    assert m.to_dict() == {"value": 0.1, "interval": [-0.02, 0.2], "level": 0.95, "resamples": "test examples",
                           "n": 400, "unit": "accuracy difference"}
    assert Metric.from_dict(m.to_dict()) == m
    assert Metric(0.7).to_dict() == {"value": 0.7}
    with pytest.raises(ValueError, match="says nothing of what it resamples"):
        Metric(0.1, (0.0, 0.2))
    with pytest.raises(ValueError, match="low <= high"):
        Metric(0.1, (0.3, 0.2), resamples="runs")
    with pytest.raises(TypeError, match="expected a number"):
        Metric("0.1")
    with pytest.raises(ValueError, match="keys .*accepted: value"):
        Metric.from_dict({"mean": 0.1})


def test_a_record_is_written_whole_and_read_back(tmp_path):
    record = Record(MADE, {"task": "cr", "seed": 15}, {"acc": Metric(0.75, n=400, unit="accuracy"),
                                                       "gain": Metric(0.1, (0.0, 0.2), 400, "test examples")},
                    {"test": ["t1", "t2"]}, "x.json")
    path = write_record(tmp_path / "x.json", record)
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA and set(data) == {"schema", "provenance", "config", "metrics", "example_ids"}
    assert read_record(path) == record
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # nothing half-written beside it
    with pytest.raises(ValueError, match="metric 'acc'.*not finite"):
        write_record(tmp_path / "y.json", Record(MADE, {}, {"acc": Metric(math.nan)}, name="y.json"))
    assert not (tmp_path / "y.json").exists()
    with pytest.raises(ValueError, match="no provenance"):
        Record({}, {}, {})
    with pytest.raises(KeyError, match="has no metric 'loss'; it has: acc, gain"):
        record["loss"]
    (tmp_path / "old.json").write_text(json.dumps({"accuracy": 0.7}))
    with pytest.raises(ValueError, match="schema None; accepted: 'icl-ssm-record/1'"):
        read_record(tmp_path / "old.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not a readable JSON record"):
        read_record(tmp_path / "bad.json")


def test_the_adapter_reads_a_stored_trust_run_and_refuses_an_unknown_family():
    name = "trust-calibrated/cr-s15.json"
    raw = json.loads((ROOT / "docs" / "results" / name).read_text())
    record = as_record(name, raw)
    assert record["handed"].value == raw["handed_test_accuracy"] and record["handed"].n == raw["test_size"] == 400
    vs = record["calibrated_plain_vs_median"]
    assert vs.value == raw["calibrated_plain"]["vs_median_prompt"]["mean"]
    assert vs.interval == tuple(raw["calibrated_plain"]["vs_median_prompt"]["ci95"]) and vs.resamples == "test examples"
    assert record["calibrated_plain_at_or_above"].value == raw["calibrated_plain"]["at_or_above"]
    assert record.example_ids["test"] == raw["test_ids"] and "test scoring" in record.provenance
    assert as_record("any/x.json", record.to_dict()) == Record.from_dict(record.to_dict(), "any/x.json")
    with pytest.raises(ValueError, match="'fidelity-x.json': neither of the record schema"):
        as_record("fidelity-x.json", {"spearman": 0.3})


def test_the_renderer_prints_each_interval_beside_its_value_and_what_it_rests_on():
    rows = [Record(MADE, {"task": "cr"}, {"acc": Metric(0.75), "gain": Metric(0.1, (0.0, 0.2), 400, "test examples")}),
            Record(MADE, {"task": "sst2"}, {"acc": Metric(None), "gain": Metric(-0.05, (-0.1, 0.0), 300, "runs")})]
    columns = [Column("task", config="task"), Column("acc", "acc"), Column("gain", "gain", fmt="diff"),
               Column("who", cell=lambda r: r.provenance["check"]["commit"][:7])]
    text = render(rows, columns)
    assert "| cr | 0.750 | +0.100 [+0.000, +0.200] | aaaaaaa |" in text
    assert "| sst2 | - | -0.050 [-0.100, +0.000] | aaaaaaa |" in text
    assert text.endswith("Intervals: 'gain': 95% intervals over runs / test examples, n = 300-400.")
    assert intervals_note(rows, columns[:2]) == ""
    with pytest.raises(ValueError, match="give one of metric, config or cell"):
        Column("x", metric="acc", config="task")
    with pytest.raises(ValueError, match="fmt='pp'; accepted"):
        Column("x", metric="acc", fmt="pp")


def test_the_adapter_reads_a_one_task_headroom_record_and_refuses_two():
    name = "calibration/headroom-k20-foobar-seed0.json"
    raw = json.loads((ROOT / "docs" / "results" / name).read_text())
    record = as_record(name, raw)
    batch = raw["tasks"]["rotten_tomatoes_foobar"]["summary"]["batch"]
    assert record.config["task"] == "rotten_tomatoes_foobar" and record.config["k"] == 20
    assert record["batch.median"].value == batch["median"] and record["batch.spearman"].value == batch[
        "validation_test_spearman"]
    gain = record["batch.best_minus_median"]
    assert gain.interval == tuple(batch["best_minus_median"]["ci95"]) and gain.resamples == "test examples"
    assert record["dense_seconds"].value is None  # recorded before the dense pass was timed
    two = {**raw, "tasks": {"a": raw["tasks"]["rotten_tomatoes_foobar"], "b": raw["tasks"]["rotten_tomatoes_foobar"]}}
    with pytest.raises(ValueError, match="one task; it holds 2"):
        as_record(name, two)


def test_a_part_of_a_record_is_a_row_of_its_own():
    record = Record(MADE, {"task": "cr"}, {"bm25.acc": Metric(0.7), "random.acc": Metric(0.6), "random.sd": Metric(0.1),
                                           "wall": Metric(3.0)}, {"test": ["t1"]}, "x.json")
    part = record.part("random")
    assert set(part.metrics) == {"acc", "sd"} and part["acc"].value == 0.6
    assert part.config == {"task": "cr", "part": "random"} and part.provenance == MADE and part.name == "x.json"
    with pytest.raises(KeyError, match="no part 'topk'"):
        record.part("topk")
    rows = [record.part(p) for p in ("bm25", "random")]
    text = render(rows, [Column("arm", config="part"), Column("acc", "acc", fmt=lambda x: f"{100 * x:.0f}%")])
    assert "| bm25 | 70% |" in text and "| random | 60% |" in text


def test_the_readers_are_gathered_from_their_modules_and_an_overlap_is_refused(monkeypatch):
    import types

    from claim_tables import adapt, readers

    assert adapt.FAMILIES["trust-calibrated/"].__module__ == "claim_tables.readers.trust_calibrated"
    clash = types.ModuleType("claim_tables.readers.zz_clash")
    clash.FAMILIES = {"trust-calibrated/run": lambda raw, name: None}
    monkeypatch.setitem(sys.modules, clash.__name__, clash)
    real = adapt.pkgutil.iter_modules
    monkeypatch.setattr(adapt.pkgutil, "iter_modules",
                        lambda path: [*real(path), types.SimpleNamespace(name="zz_clash")])
    with pytest.raises(ValueError, match="overlaps 'trust-calibrated/'"):
        adapt._gather()
    assert readers.__name__ == "claim_tables.readers"


def test_the_intervals_line_names_together_the_columns_that_rest_on_the_same_units():
    rows = [Record(MADE, {}, {"a": Metric(0.1, (0.0, 0.2), 400, "test examples"),
                              "b": Metric(0.2, (0.1, 0.3), 400, "test examples"),
                              "c": Metric(0.3, (0.2, 0.4), 32, "subsets")}, {}, "x.json")]
    note = intervals_note(rows, [Column("A", "a"), Column("B", "b"), Column("C", "c")])
    assert note == ("Intervals: 'A' and 'B': 95% intervals over test examples, n = 400; "
                    "'C': 95% intervals over subsets, n = 32.")
