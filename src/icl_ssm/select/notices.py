"""What a selection's summary warns about, as lines for stderr: how reliably the validation set
ranked the subsets (:func:`reliability_lines`) and a prompt that leans to one label
(:func:`lean_lines`). Both read the summary :func:`~icl_ssm.select.stage.select_demonstrations`
returns and print nothing themselves."""

from __future__ import annotations

from icl_ssm.select.subset_losses import RELIABILITY_TARGET


def reliability_lines(summary: dict) -> list[str]:
    """What the split-half of the subset losses says, for stderr: its value, the whole validation
    set's reliability, and a warning with the queries it would take when that is below target."""
    split = summary.get("split_half")
    if split is None:
        return []
    used = summary.get("queries_used") or summary["validation_size"]
    lines = [f"split-half of the subset losses: {split:.2f} (Spearman between the subsets' losses on two halves of "
             f"the {used} validation queries); reliability of the whole set "
             f"{summary['reliability']:.2f} (Spearman-Brown)"]
    if split <= 0:
        lines.append("warning: the two halves of the validation set do not agree on which subsets are better, so "
                     "the affinity scores are mostly noise; use more validation queries (--queries) or "
                     "--balance-labels")
    elif summary["reliability"] < RELIABILITY_TARGET:
        lines.append(f"warning: the validation set orders the subsets with reliability {summary['reliability']:.2f}; "
                     f"about {summary['queries_needed']} queries (--queries) would give "
                     f"{RELIABILITY_TARGET} (Spearman-Brown)")
    if summary.get("score_reliability") is not None:
        lines.append(f"reliability of the candidates' affinity scores: {summary['score_reliability']:.2f} (scores from "
                     f"two halves of the {summary.get('subsets')} subsets, Spearman-Brown)"
                     + ("" if summary["score_reliability"] >= RELIABILITY_TARGET else
                        "; --budget MINUTES grows the subsets toward " + str(RELIABILITY_TARGET)))
    return lines


LEAN = 1.3  # lean_lines warns when one label holds more than this times its even share of the k places


def lean_lines(summary: dict) -> list[str]:
    """A warning, for stderr, when the chosen demonstrations lean to one label (more than
    ``LEAN`` times its even share of ``k``) and ``--per-label`` was not asked for."""
    counts = summary.get("labels")
    if not counts or summary.get("per_label") or len(counts) < 2:
        return []
    label, top = max(counts.items(), key=lambda kv: kv[1])
    if top <= LEAN * summary["k"] / len(counts):
        return []
    return [f"warning: {top} of the {summary['k']} chosen demonstrations are {label!r}; a prompt that leans to one "
            "label pulls the answers toward it, and --per-label shares the places out evenly (BENCHMARKS.md, "
            "\"One label's share of the prompt\")"]
