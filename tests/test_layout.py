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
    ("icl_ssm.atomic", "icl_ssm.cost"),
    ("icl_ssm.data",),
    ("icl_ssm.lm",),
    ("icl_ssm.ssm",),
    ("icl_ssm.compress",),
    ("icl_ssm.distill",),
    ("icl_ssm.evaluate",),
    ("icl_ssm.select",),
    ("icl_ssm.report", "icl_ssm.bench", "icl_ssm.synthetic"),
    ("icl_ssm.pipeline",),
    ("icl_ssm.cli", "icl_ssm.__main__"),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int | None:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


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


def test_the_checker_sees_an_upward_import(tmp_path):
    """The walk above is not vacuous: an upward import in a file is found."""
    fake = tmp_path / "mod.py"
    fake.write_text("def f():\n    from icl_ssm.select.run import SelectConfig\n")
    assert (2, "icl_ssm.select.run") in imported_modules(fake)
    assert layer("icl_ssm.select.run") > layer("icl_ssm.lm.prompts")
