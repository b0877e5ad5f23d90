"""Writing a run's report: the result dict checked, then ``report.md``, ``report.json`` and the
plots into one directory, each file atomically, ``report.json`` last."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from icl_ssm import atomic
from icl_ssm.report.figures import _accuracy_fig, _calibration_fig, _cost_fig
from icl_ssm.report.markdown import _markdown


def _validate(report: Any) -> None:
    if not isinstance(report, dict):
        raise ValueError(f"report={type(report).__name__}: expected a dict of run results")
    selections = report.get("selections") or []
    if not isinstance(selections, list) or not all(isinstance(s, dict) for s in selections):
        raise ValueError(f"report['selections']={selections!r:.80}: expected a list of dicts, one per method")
    if report.get("affinity_scores") is not None and not isinstance(report["affinity_scores"], list):
        raise ValueError(f"report['affinity_scores']={report['affinity_scores']!r:.80}: expected a list or None")
    for key in ("fidelity", "fidelity_verdict", "check", "handed_over", "search", "picks"):
        if report.get(key) is not None and not isinstance(report[key], dict):
            raise ValueError(f"report[{key!r}]={report[key]!r:.80}: expected a dict or None")
    size = report.get("pool_size") or len(report.get("affinity_scores") or [])
    prompts = dict(report.get("picks") or {})
    if report.get("handed_over"):
        prompts["handed over"] = report["handed_over"].get("indices") or []
    for name, indices in prompts.items():
        if not isinstance(indices, list):
            raise ValueError(f"pool indices of {name!r}={indices!r:.80}: expected a list")
        bad = [i for i in indices if not isinstance(i, int) or (size and not 0 <= i < size)]
        if bad:
            raise ValueError(f"pool indices of {name!r} hold {bad[:5]}: expected pool indices in [0, {size})")


def _save_png(fig: Figure, path: Path) -> Path:
    return atomic.write_with(path, lambda f: fig.savefig(f, format="png"))


def write_report(out: str | Path, report: dict) -> dict[str, Path]:
    """Write ``report.md``, ``report.json``, ``accuracy.png`` and ``cost.png`` into directory ``out``.

    ``report`` holds ``model, task, k, seed``, ``selections`` (one dict per method, in display
    order: ``name``, ``method``, ``test_accuracy``, ``test_size``, ``flops``, ``wall_seconds``,
    ...), and optionally ``fidelity``, ``fidelity_verdict``, ``check`` and ``handed_over`` (the
    hand-over check, :mod:`icl_ssm.select.check`), ``picks`` and ``preferred``, ``search`` (the
    prompt search's record), ``affinity_scores``, ``pool_size``, ``prompt_file``/``selected_file``.
    ``report`` itself is not modified. Returns ``{"markdown", "json", "accuracy", "cost"} -> Path``,
    and ``"calibration"`` (``calibration.png``) where the check measured calibrated prompts.
    """
    _validate(report)
    out = atomic.prepare_dir(out, what="report directory")
    figures = {"accuracy": _accuracy_fig, "cost": _cost_fig}
    if ((report.get("check") or {}).get("calibrated")):  # what calibration earned and what selection added
        figures = {"calibration": _calibration_fig, **figures}
    plots = {name: f"{name}.png" for name in figures}
    # Serialise before writing anything, so that a non-JSON value leaves no partial report.
    json_text = json.dumps({**report, "plots": plots}, indent=1) + "\n"
    markdown = _markdown(report, plots)
    written = {name: _save_png(draw(report), out / plots[name]) for name, draw in figures.items()}
    written["markdown"] = atomic.write_text(out / "report.md", markdown)
    written["json"] = atomic.write_text(out / "report.json", json_text)
    return written
