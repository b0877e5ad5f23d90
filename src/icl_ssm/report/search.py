"""The prompt search's record in words: :func:`search_lines`, the "Prompt search" section of
``report.md`` (the plan and the time it took, the prompts screened by source, the screen's
reliability and its agreement with the dense confirmation, the winner, the rungs)."""

from __future__ import annotations

from icl_ssm.report.values import DASH, _cell, _fmt, _is_num, _table

_SOURCES = {  # where the search's candidate prompts came from (select.search.SOURCES), in words
    "random": "random prompts",
    "balanced": "label-balanced random prompts",
    "affinity": "Algorithm 2's top k from the screen's losses",
    "seed": "other methods' picks",
    "swap": "swaps and reorderings of the best screened",
}


def _took(search: dict) -> str:
    """The budget and the wall seconds taken, in total and by phase."""
    budget, wall, phases = search.get("budget_seconds"), search.get("wall_seconds"), search.get("phases") or {}
    took = ", ".join(f"{p} {phases[p]:.0f} s" for p in ("pilot", "screen", "confirm", "order")
                     if _is_num(phases.get(p)))
    return f"Budget {_fmt(budget, '.0f')} s, took {_fmt(wall, '.0f')} s" + (f" ({took})." if took else ".")


def _plan(search: dict, screen: str) -> str:
    """The plan: what to screen on which caches, the successive halving's rungs, the orders."""
    plan = search.get("plan") or {}
    sec = plan.get("seconds") or {}
    per = plan.get("per_prompt") or {}
    rungs = " -> ".join(f"{a} x {q}" for a, q in plan.get("rungs") or [])
    screened_plan = (f"screen {plan.get('screened')} prompts on the {screen} caches "
                     f"({_fmt(sec.get('screen'), '.0f')} s, {_fmt(per.get('screen'), '.2f')} s per prompt), "
                     if screen != "none" and plan.get("screened") else "no screen (random search), ")
    return (f"- Plan: {screened_plan}confirm {_cell(plan.get('arms'))} on dense caches by successive halving "
            f"({rungs or DASH} prompts x queries, {_fmt(sec.get('confirm'), '.0f')} s), order the survivor over "
            f"{_cell(plan.get('orders'))} orders ({_fmt(sec.get('order'), '.0f')} s).")


def _screened(search: dict, screen: str, by_source: str) -> list[str]:
    """What was screened and how reliably, and how the screen agreed with the dense confirmation."""
    sq = search.get("screen_queries")
    lines = [f"- Screened: {_cell(search.get('screened'))} prompts on the {screen} caches, each on the same "
             f"{_cell(sq)} label-balanced validation queries; candidates by source: {by_source or DASH}."]
    half, rel = search.get("screen_split_half"), search.get("screen_reliability")
    if _is_num(half):
        halves = f"two halves of {sq // 2} queries" if isinstance(sq, int) else "two halves of its queries"
        lines.append(f"- Screen reliability: split-half Spearman {half:.2f} between the prompts' losses on "
                     f"{halves}, Spearman-Brown {_fmt(rel, '.2f')} for all {_cell(sq)}; over the "
                     f"{_cell(search.get('screened'))} screened prompts.")
    else:
        lines.append("- Screen reliability: not measured (fewer than 3 prompts, or 2 queries, with per-query "
                     "losses).")
    rho, first = search.get("screen_vs_confirm_spearman"), (search.get("rungs") or [{}])[0]
    if _is_num(rho):
        lines.append(f"- Screen vs dense confirmation: Spearman {rho:.2f} between the screen's loss and the dense "
                     f"loss on the first rung's {_cell(first.get('queries'))} queries, over its "
                     f"{_cell(first.get('arms'))} prompts.")
    else:
        lines.append("- Screen vs dense confirmation: not measured (fewer than 3 prompts on the first rung).")
    return lines


def _winner(search: dict) -> str:
    """Where the winner came from, its dense loss and the order chosen for it."""
    winner = search.get("winner_source")
    loss = search.get("winner_confirm_loss")
    won = (f"- Winner: from {_SOURCES.get(winner, _cell(winner))}, dense loss {_fmt(loss)} on "
           f"{_cell(search.get('confirm_queries'))} queries")
    order = search.get("order_search") or {}
    cands = order.get("candidates") or []
    if cands and isinstance(order.get("chosen"), int) and order["chosen"] < len(cands):
        best = cands[order["chosen"]]
        won += (f"; its order chosen among {len(cands)} on the same queries: {best.get('order')} "
                f"(loss {_fmt(best.get('validation_loss'))})")
    return won + "."


def _rung_table(search: dict) -> list[str]:
    """One row per rung of the successive halving (none without rungs)."""
    table = []
    for i, r in enumerate(search.get("rungs") or []):
        losses, srcs = r.get("losses") or [], r.get("sources") or []
        kept = ", ".join(srcs[:4]) + (", ..." if len(srcs) > 4 else "")
        table.append([str(i + 1), _cell(r.get("arms")), _cell(r.get("queries")),
                      _fmt(losses[0]) if losses else DASH, kept or DASH])
    if not table:
        return []
    return ["", *_table(["Rung", "Prompts", "Dense queries each", "Best dense loss", "Sources (best first)"], table)]


def search_lines(search: dict | None) -> list[str]:
    """The prompt search in words: the plan and the time it took, the prompts screened by source,
    the screen's reliability and its agreement with the dense confirmation, the winner (report.md)."""
    if not search:
        return []
    screen = search.get("screen") or "none"
    lines = [_took(search), "", _plan(search, screen)]
    sources = search.get("sources") or {}
    by_source = ", ".join(f"{_SOURCES.get(s, s)} {c}" for s, c in sorted(sources.items(), key=lambda x: -x[1]))
    if screen != "none":
        lines += _screened(search, screen, by_source)
    else:
        lines.append(f"- No screen: candidates went straight into the dense confirmation; by source: "
                     f"{by_source or DASH}.")
    lines.append(_winner(search))
    if search.get("stopped"):
        lines.append(f"- Stopped early: {search['stopped']}.")
    return lines + _rung_table(search)
