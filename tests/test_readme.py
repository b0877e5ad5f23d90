"""The README's Python example runs as written (real model: marked slow)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_example() -> str:
    text = README.read_text()
    section = text[text.index("### In Python"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_is_at_most_ten_lines_of_steps():
    lines = [line for line in python_example().splitlines() if line.strip()]
    steps = [line for line in lines if not line.startswith(("import", "from", "    "))]
    assert len(steps) <= 10, steps


@pytest.mark.slow
def test_readme_example_runs(capsys):
    namespace: dict = {}
    exec(compile(python_example(), str(README), "exec"), namespace)
    chosen = namespace["chosen"]
    assert chosen.k == 20 and len(set(chosen.ids)) == 20 and chosen.model == "smollm2-135m"
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) >= 2  # the generated answer, then the eight inputs' answers
    answers = eval(printed[-1])
    assert len(answers) == 8 and set(answers) <= {"positive", "negative"}


def test_the_readme_figure_is_drawn_from_the_trust_records(tmp_path):
    """docs/handed-over.png, which the README shows, is drawn by tools/figures/handed_over.py from the
    trust records, with any number of calibrated runs (none, or more than one), and is linked."""
    import shutil

    from helpers import research_script

    figure = research_script("handed_over", folder="tools/figures")
    results = README.parent / "docs" / "results"
    assert "](docs/handed-over.png)" in README.read_text()
    assert (README.parent / "docs" / "handed-over.png").read_bytes().startswith(b"\x89PNG")
    shutil.copytree(results / "trust-search", tmp_path / "trust-search")
    assert figure.main(["--results", str(tmp_path), "--out", str(tmp_path / "none.png")]) == 0
    (tmp_path / "trust-calibrated").mkdir()
    stored = next((results / "trust-calibrated").glob("*.json"))
    for seed in (15, 16):
        shutil.copy(stored, tmp_path / "trust-calibrated" / f"r-s{seed}.json")
    assert figure.main(["--results", str(tmp_path), "--out", str(tmp_path / "two.png")]) == 0
    assert (tmp_path / "two.png").read_bytes().startswith(b"\x89PNG")
    shutil.rmtree(tmp_path / "trust-search")
    assert figure.main(["--results", str(tmp_path), "--out", str(tmp_path / "only.png")]) == 0
    assert figure.main(["--results", str(tmp_path / "absent"), "--out", str(tmp_path / "no.png")]) == 1
