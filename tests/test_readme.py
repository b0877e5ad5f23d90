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
