"""What affinity, BRIDGE and the search's screen score subsets on in ``icl-ssm run``: the fidelity
verdict on the run's compressor, or the evaluator ``--evaluator`` forces (:func:`choose_evaluator`),
as one typed stage result (:class:`EvaluatorChoice`) that the selection stages read and the report
stores."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from icl_ssm.evaluate.verdict import failed_checks, fidelity_verdict
from icl_ssm.pipeline.config import RunConfig
from icl_ssm.pipeline.stages import say


@dataclass(frozen=True)
class EvaluatorChoice:
    """``evaluator``: what subsets are scored on (``compressed`` or ``dense``); ``verdict``: what the
    fidelity measurement chose (``evaluator`` unless ``--evaluator`` forced another); ``reason`` and
    ``summary``: why, in words; ``checks``: the verdict's checks, each passed or failed (none without
    a measurement); ``measured``: the fidelity verdict's other fields (its margins and thresholds)."""

    evaluator: str
    verdict: str
    reason: str
    summary: str = ""
    checks: list[dict[str, Any]] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)

    @property
    def compressed(self) -> bool:
        return self.evaluator == "compressed"

    def as_dict(self) -> dict[str, Any]:
        """The report's ``fidelity_verdict``."""
        return {**self.measured, "evaluator": self.evaluator, "verdict": self.verdict, "reason": self.reason,
                "summary": self.summary, "checks": self.checks}


def choose_evaluator(cfg: RunConfig, fidelity: dict | None, unused: bool = False) -> EvaluatorChoice:
    """The evaluator of affinity, BRIDGE and the search's screen:
    :func:`~icl_ssm.evaluate.verdict.fidelity_verdict` on the fidelity stage (``cfg.evaluator="auto"``),
    or the one ``cfg.evaluator`` forces. The verdict is printed whether it passes or fails; a
    forced evaluator says so, and compressed caches forced against a failed verdict are warned about.
    Without a compressor (``fidelity`` None) the evaluator is dense and the reason says so; ``unused``:
    there was one, but no method asked reads the verdict (:func:`uses_compressor`)."""
    if fidelity is None:
        if cfg.evaluator == "compressed" and not unused:
            raise ValueError(f"--evaluator compressed needs a compressor, and none is shipped for --model {cfg.model} "
                             f"and --task {cfg.task}: pass --compressor DIR or --distill")
        reason = ("no method asked scores subsets on compressed caches, so the compressor's fidelity was not measured"
                  if unused else
                  "no compressor was given, shipped or distilled, so affinity scores subsets on dense caches")
        return EvaluatorChoice("dense", "dense", reason, reason)
    measured = fidelity_verdict(fidelity, max_accuracy_drop=cfg.max_accuracy_drop)
    verdict = {**measured, "verdict": measured["evaluator"]}
    if verdict.get("summary") and verdict["verdict"] == "compressed":  # a failed verdict is said below, once
        say(verdict["summary"])
    if cfg.evaluator != "auto":
        verdict.update(evaluator=cfg.evaluator, reason=f"--evaluator {cfg.evaluator} was asked for" + (
            f"; the fidelity verdict would have chosen {verdict['verdict']}"
            if verdict["verdict"] != cfg.evaluator else ""))
    if verdict["verdict"] == "dense":
        if cfg.evaluator == "compressed":
            say(f"warning: the fidelity verdict failed the compressed caches ({failed_checks(verdict['checks'])}); "
                "selecting with them because --evaluator compressed was asked for")
        else:
            say(f"warning: {verdict['reason']}")
    core = ("evaluator", "verdict", "reason", "summary", "checks")
    return EvaluatorChoice(*(verdict.get(key) for key in core[:3]), verdict.get("summary") or "",
                           list(verdict.get("checks") or []), {k: v for k, v in verdict.items() if k not in core})
