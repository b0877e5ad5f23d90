"""The published tables are rendered from their records: tools/claims.py."""

import json
import shutil
from pathlib import Path

import pytest
from helpers import research_script

claims = research_script("claims", folder="tools")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def copy(tmp_path):
    """The markdown files with generated tables and the records, copied under a temporary root."""
    for file in {f for f, _ in claims.TABLES.values()}:
        shutil.copy(ROOT / file, tmp_path / file)
    shutil.copytree(ROOT / claims.RESULTS, tmp_path / claims.RESULTS)
    return tmp_path


def test_committed_tables_match_their_records():
    assert claims.check(ROOT) == []


def test_a_number_changed_in_a_table_fails_naming_the_number_and_record(copy):
    readme = copy / "README.md"
    text = readme.read_text()
    assert "42.7x more" in text
    readme.write_text(text.replace("42.7x more", "43.7x more"))
    problems = claims.check(copy)
    assert len(problems) == 1
    assert "README.md" in problems[0] and "'results'" in problems[0]
    assert "43.7 where the records give 42.7" in problems[0]
    assert "docs/results/select-cost-attention.json" in problems[0]
    assert claims.main(["--root", str(copy)]) == 1


def test_a_changed_record_fails_until_the_table_is_rendered_again(copy):
    path = copy / claims.RESULTS / "synthetic-products-select-k20.json"
    record = json.loads(path.read_text())
    row = next(r for r in record["summary"] if r["method"] == "topk")
    row["mse"] = 0.5
    path.write_text(json.dumps(record))
    problems = claims.check(copy)
    assert problems and "0.767 where the records give 0.500" in problems[0]
    assert claims.check(copy, write=True) == []
    assert claims.check(copy) == []
    assert "topk 0.500" in (copy / "README.md").read_text()


@pytest.mark.parametrize("key", claims.PROVENANCE)
def test_a_record_without_its_provenance_fails(copy, key):
    path = copy / claims.RESULTS / "select-cost-attention.json"
    record = json.loads(path.read_text())
    del record["provenance"][key]
    path.write_text(json.dumps(record))
    with pytest.raises(claims.ClaimError, match=f"select-cost-attention.json: provenance lacks {key}"):
        claims.check(copy)
    assert claims.main(["--root", str(copy)]) == 1


def test_missing_markers_are_named(copy):
    readme = copy / "README.md"
    readme.write_text(readme.read_text().replace("<!-- /table results -->", ""))
    with pytest.raises(claims.ClaimError, match="README.md: no markers for table 'results'"):
        claims.check(copy)


def test_trust_records_count_runs_at_or_above_the_median():
    runs = [{"plain": {"at_or_above": 8, "count": 16, "shown_better": False}},
            {"plain": {"at_or_above": 12, "count": 16, "shown_better": True}},
            {"plain": {"at_or_above": 7, "count": 16, "shown_better": False}}]
    assert claims.trust_counts(runs) == {"runs": 3, "at_or_above_median": 2, "at_or_above_three_quarters": 1,
                                         "shown_better": 1}
