"""The package's import graph follows the data flow: no module imports from a later layer,
and no library module imports the command line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "icl_ssm"

# The layers in data-flow order; a module may import only from its own layer or earlier ones.
LAYERS = (
    ("icl_ssm.atomic", "icl_ssm.cost", "icl_ssm.lock", "icl_ssm.provenance", "icl_ssm.records", "icl_ssm.schema"),
    ("icl_ssm.data",),
    ("icl_ssm.lm",),
    ("icl_ssm.calibrate",),  # a per-label bias on label scores
    ("icl_ssm.ssm",),
    ("icl_ssm.compress",),
    ("icl_ssm.distill",),
    ("icl_ssm.evaluate",),
    ("icl_ssm.select",),
    ("icl_ssm.apply",),  # a selection answered with and exported
    ("icl_ssm.report",),
    ("icl_ssm.pipeline",),
    ("icl_ssm.cli", "icl_ssm.__main__"),
)
BENCH = SRC.parent / "bench" / "src" / "icl_ssm_bench"  # the benchmarks and the study: above the whole library


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int | None:
    found = [(len(p), i) for i, prefixes in enumerate(LAYERS) for p in prefixes
             if module == p or module.startswith(p + ".")]
    return max(found)[1] if found else None  # the most specific prefix


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every ``icl_ssm`` import in the file, at any depth; ``from pkg
    import sub`` names the submodule when ``sub`` is one."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "icl_ssm":
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                as_path = SRC / candidate.replace(".", "/")
                is_module = as_path.with_suffix(".py").exists() or (as_path / "__init__.py").exists()
                found.append((node.lineno, candidate if is_module else node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "icl_ssm"]
    return found


def library_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py")


def test_every_module_has_a_layer():
    assert [module_name(p) for p in library_files() if layer(module_name(p)) is None] == []


@pytest.mark.parametrize("path", library_files(), ids=lambda p: module_name(p))
def test_no_import_from_a_later_layer(path):
    mine = layer(module_name(path))
    upward = [f"line {line}: {module}" for line, module in imported_modules(path)
              if module != "icl_ssm" and (layer(module) or 0) > mine]
    assert upward == [], f"{module_name(path)} imports from a later layer"


def test_the_library_never_imports_the_command_line():
    offenders = [f"{module_name(p)} line {line}" for p in library_files() if not module_name(p).startswith(
        ("icl_ssm.cli", "icl_ssm.__main__")) for line, module in imported_modules(p)
        if module.startswith("icl_ssm.cli")]
    assert offenders == []


def test_the_library_never_imports_the_benchmarks_or_the_study():
    """``icl_ssm`` is what a user installs: no module of it imports ``icl_ssm_bench`` (the
    command line finds ``bench`` and ``synthetic`` through entry points), and the benchmarks
    reach the library through its modules, never the command line's private helpers."""
    import ast as ast_

    def imports(path: Path) -> list[str]:
        found = []
        for node in ast_.walk(ast_.parse(path.read_text())):
            if isinstance(node, ast_.ImportFrom) and node.module:
                found.append(node.module)
            elif isinstance(node, ast_.Import):
                found += [a.name for a in node.names]
        return found

    into_bench = [f"{module_name(p)}: {m}" for p in PACKAGE.rglob("*.py") for m in imports(p)
                  if m.split(".")[0] == "icl_ssm_bench"]
    assert into_bench == []
    bench_files = sorted(BENCH.rglob("*.py"))
    assert len(bench_files) > 20
    into_cli = [f"{p.relative_to(BENCH)}: {m}" for p in bench_files for m in imports(p) if m.startswith("icl_ssm.cli")]
    assert into_cli == []


CACHE_API = ("DynamicCache", "get_seq_length", "batch_repeat_interleave", "ddp_cache_data")


def test_only_lm_hf_touches_the_transformers_cache_api():
    """The Cache API (making a ``DynamicCache``, reading its length, repeating its rows) is reached
    through :mod:`icl_ssm.lm.hf` alone, so a transformers release that renames it breaks one file."""
    touching = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        names |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.keyword) and n.arg}
        if found := sorted(names & set(CACHE_API)):
            touching[module_name(path)] = found
    assert touching == {"icl_ssm.lm.hf": sorted(CACHE_API)}


def test_the_checker_sees_an_upward_import(tmp_path):
    """The walk above is not vacuous: an upward import in a file is found."""
    fake = tmp_path / "mod.py"
    fake.write_text("def f():\n    from icl_ssm.select.stage import SelectConfig\n")
    assert (2, "icl_ssm.select.stage") in imported_modules(fake)
    assert layer("icl_ssm.select.stage") > layer("icl_ssm.lm.prompts")


def test_the_adding_a_selector_example_registers_a_working_method():
    """docs/adding-a-selector.md's worked example: one file, one registration, and the method
    is found by name and selects."""
    import re

    import numpy as np

    from icl_ssm.data.tasks import get_task
    from icl_ssm.select.base import SELECTORS

    doc = (SRC.parent / "docs" / "adding-a-selector.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    try:
        exec(compile(code, "adding-a-selector.md", "exec"), {})
        pool = get_task("coin_flip", size=30).examples()[:20]
        selector = SELECTORS["longest"].from_config(None, None, None)
        assert selector.planned(len(pool), 3) == 0 and not selector.balances_labels
        chosen = selector.select(pool, pool[:2], 3, np.random.default_rng(0))
        longest = sorted(range(len(pool)), key=lambda i: len(pool[i].input))[-3:]
        assert sorted(chosen.indices) == sorted(longest)
    finally:
        SELECTORS.pop("longest", None)


def test_the_selection_driver_names_no_concrete_selector():
    """select/stage.py builds every selector from the registry and asks it what it needs to know
    (hooks, planned, balances_labels, findings): it imports no selector's module."""
    from icl_ssm.select import base

    concrete = {f"icl_ssm.select.{name}" for name in ("affinity", "bm25", "bridge", "gradce", "random_k", "search",
                                                      "topk")}
    imported = {module for _, module in imported_modules(PACKAGE / "select" / "stage.py")}
    assert imported & concrete == set()
    assert base.Selector.planned(base.Selector(), 10, 2) == 0


def commands_in_docs() -> list[str]:
    """Every ``icl-ssm ...`` command line inside a code block of the README and docs/ pages."""
    import re
    import shlex

    root = SRC.parent
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    found = []
    for page in pages:
        for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip()
                if line.startswith("icl-ssm ") and "..." not in line:  # not an elided example
                    found.append((page.name, shlex.split(line)[1:]))
    return found


@pytest.mark.parametrize("page, argv", commands_in_docs(), ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_every_command_in_the_docs_parses(page, argv):
    """A command shown to a user is a command the CLI accepts (flags and choices)."""
    from icl_ssm.cli import build_parser

    if argv[0].endswith(":") or argv[-1] in ("--help", "-h"):  # a printed error message, or help
        return
    try:
        build_parser().parse_args(argv)
    except SystemExit as exit_:
        pytest.fail(f"{page}: icl-ssm {' '.join(argv)} does not parse ({exit_})")


def test_without_the_benchmark_package_its_commands_say_how_to_install_it(monkeypatch, capsys):
    """``icl-ssm bench`` and ``icl-ssm synthetic`` come from the entry points of ``bench/``; where
    it is not installed, each command is still listed and refuses with the install line."""
    from icl_ssm import cli

    assert set(cli.plugin_parsers()) == {"bench", "synthetic"}  # installed here by make install
    monkeypatch.setattr(cli, "plugin_parsers", dict)
    for argv in (["bench", "scan", "--quick"], ["synthetic"]):
        assert cli.main(argv) == 2
        assert "pip install -e bench/" in capsys.readouterr().err


@pytest.mark.parametrize("package", sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py")
                                           if p.parent.name != "pretrained"))
def test_every_subpackage_says_what_it_holds_and_what_it_must_not_import(package):
    """A newcomer opening a subpackage reads what is in it and where it stands in the layers."""
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text())) or ""
    assert len(doc.split()) >= 25, f"icl_ssm.{package}: a docstring of {len(doc.split())} words"
    assert "import" in doc.lower() and "tests/test_layout.py" in doc, f"icl_ssm.{package}: no word on its imports"


def test_files_and_functions_stay_small():
    """One file, one idea: no library file over 400 lines, no function over 60."""
    long_files = [f"{p.relative_to(SRC)}: {n} lines" for p in PACKAGE.rglob("*.py")
                  if (n := len(p.read_text().splitlines())) > 400]
    long_functions = [f"{p.relative_to(SRC)}:{node.name}: {node.end_lineno - node.lineno + 1} lines"
                      for p in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
                      if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                      and node.end_lineno - node.lineno + 1 > 60]
    assert long_files == [] and long_functions == []


def test_the_code_passes_its_linter():
    """`make lint`'s check, run with the suite so that CI holds it too."""
    import shutil
    import subprocess
    import sys

    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    done = subprocess.run([ruff, "check", "src", "tests", "tools", "research", "bench"], cwd=SRC.parent,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]
