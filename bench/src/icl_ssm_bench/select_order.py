"""``icl-ssm bench select-order``: earlier selections scored again in every prompt order.

The selections of earlier ``select-quality`` reports on the test set in every prompt order of
:func:`icl_ssm.select.base.arrange`, with the run of one label that ends each prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.base import ARRANGE_ORDERS, arrange, order_rng
from icl_ssm.select.held_out import evaluate_selection
from icl_ssm_bench.selection import log


@dataclass(frozen=True)
class SelectOrderConfig:
    """One ``icl-ssm bench select-order`` run: earlier selections' test accuracy in each prompt order."""

    model: str  # the model the reports were made with
    reports: tuple[str, ...]  # select-quality --json-out files
    orders: tuple[str, ...]  # ARRANGE_ORDERS; the first is the baseline of the paired differences
    permutations: int  # draws of the random order per selection
    query_batch: int

    def validate(self) -> None:
        for order in self.orders:
            if order not in ARRANGE_ORDERS:
                raise ValueError(f"--orders {order!r}; accepted: {', '.join(ARRANGE_ORDERS)}")
        if self.permutations < 1:
            raise ValueError(f"--permutations {self.permutations}; expected >= 1 (random orders drawn per "
                             "selection)")


def tail_run(labels: list[str]) -> int:
    """How many demonstrations of the last one's label end the prompt."""
    run = 0
    for y in reversed(labels):
        if y != labels[-1]:
            break
        run += 1
    return run


def select_order(cfg: SelectOrderConfig) -> dict:
    """Every selection of the ``reports`` (``select-quality --json-out`` files) on the test set
    in each of the ``orders``; the report's own order is ``score``, whose accuracy must
    match the report's (``reproduced``). The ``random`` order is drawn ``permutations`` times
    (the first is ``select --order random``'s): their mean is the selection's accuracy with the
    order averaged out, the number that compares selections rather than orders."""
    cfg.validate()
    reports = []
    for path in cfg.reports:
        try:
            report = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"--reports {path}: not a readable select-quality report ({err})") from None
        if report.get("model") != cfg.model or "runs" not in report:
            raise ValueError(f"--reports {path}: a select-quality report of model {cfg.model!r} is expected, found "
                             f"model {report.get('model')!r}" + ("" if "runs" in report else " without runs"))
        if report["settings"].get("order", "score") != "score":
            raise ValueError(f"--reports {path}: its selections were put in {report['settings']['order']!r} order; "
                             "select-order rearranges selections in the score order (select-quality --order score)")
        reports.append((Path(path).stem, report))
    model, tokenizer = load_model(cfg.model)
    rows = []
    for name, report in reports:
        settings = report["settings"]
        for run in report["runs"]:
            task = get_task(run["task"])
            splits = split(task, pool_size=settings["pool_size"], seed=run["seed"])
            builder = PromptBuilder.for_model(model, tokenizer, task)
            test = splits.test[: settings["test_size"]]
            labels = [splits.pool[i].target for i in run["indices"]]
            zero = None  # the zero-shot row has no order: scored once
            for order in cfg.orders:
                rng = order_rng(run["seed"])  # successive draws: the permutations of the random order
                for p in range(cfg.permutations if order == "random" else 1):
                    indices = arrange(run["indices"], labels, order, rng)
                    if indices or zero is None:
                        acc = evaluate_selection(model, builder, [splits.pool[i] for i in indices], test,
                                                 query_batch=cfg.query_batch)["accuracy"]
                        zero = acc if not indices else None
                    else:
                        acc = zero
                    row = {"report": name, "task": run["task"], "seed": run["seed"], "method": run["method"],
                           "order": order, "indices": indices, "test_accuracy": acc,
                           "tail_run": tail_run([splits.pool[i].target for i in indices])}
                    if order == "random":
                        row["permutation"] = p
                    if order == "score":
                        row["reported"] = run["test_accuracy"]
                        row["reproduced"] = abs(acc - run["test_accuracy"]) < 1e-6
                    rows.append(row)
                    log(f"{name} seed {run['seed']} {run['method']} {order}"
                         + (f" {p}" if order == "random" else "") + f": {acc:.3f} (tail run {row['tail_run']})")
    return {"model": cfg.model, "orders": list(cfg.orders), "permutations": cfg.permutations, "rows": rows,
            **order_tables(rows, list(cfg.orders))}


def order_tables(rows: list[dict], orders: list[str]) -> dict:
    """``table``: per order, the statistics over selections of each selection's accuracy (its
    mean over the random order's permutations), paired against the first order; ``methods``:
    per report and method, each order's mean and std over seeds."""
    per: dict = {}  # (report, seed, method) -> order -> accuracies
    for r in rows:
        per.setdefault((r["report"], r["seed"], r["method"]), {}).setdefault(r["order"], []).append(r["test_accuracy"])
    keys = list(per)
    acc = {o: np.array([np.mean(per[key][o]) for key in keys]) for o in orders}
    table = {}
    for order in orders:
        a = acc[order]
        table[order] = {"mean": float(a.mean()), "std": float(a.std()), "min": float(a.min()), "selections": len(a)}
        draws = [len(per[key][order]) for key in keys]
        if max(draws) > 1:  # how far the order alone moves one selection's accuracy
            table[order]["within_std"] = float(np.mean([np.std(per[key][order]) for key in keys]))
            table[order]["draws"] = max(draws)
        if order != orders[0]:
            base = acc[orders[0]]
            table[order]["paired_diff"] = float((a - base).mean())
            table[order]["wins"] = int((a > base + 1e-9).sum())
            table[order]["losses"] = int((a < base - 1e-9).sum())
    methods: dict = {}
    for report, method in dict.fromkeys((key[0], key[2]) for key in keys):
        mine = [i for i, key in enumerate(keys) if key[0] == report and key[2] == method]
        methods.setdefault(report, {})[method] = {
            o: {"mean": float(acc[o][mine].mean()), "std": float(acc[o][mine].std()), "seeds": len(mine)}
            for o in orders}
    return {"table": table, "methods": methods}


def select_order_markdown(result: dict) -> str:
    base, orders = result["orders"][0], result["orders"]
    lines = ["| order | selections | test accuracy (mean ± std) | worst | paired diff vs " + base
             + " | better / worse | order draws (std within a selection) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for order, t in result["table"].items():
        diff = "—" if order == base else f"{100 * t['paired_diff']:+.1f}"
        wins = "—" if order == base else f"{t['wins']} / {t['losses']}"
        draws = f"{t['draws']} ({100 * t['within_std']:.1f})" if "draws" in t else "1"
        lines.append(f"| {order} | {t['selections']} | {100 * t['mean']:.1f} ± {100 * t['std']:.1f} | "
                     f"{100 * t['min']:.1f} | {diff} | {wins} | {draws} |")
    lines += ["", "| report | method | seeds | " + " | ".join(orders) + " |",
              "|---|---|---:|" + "---:|" * len(orders)]
    for report, by_method in result.get("methods", {}).items():
        for method, by in by_method.items():
            lines.append(f"| {report} | {method} | {by[orders[0]]['seeds']} | " + " | ".join(
                f"{100 * by[o]['mean']:.1f} ± {100 * by[o]['std']:.1f}" for o in orders) + " |")
    lines += ["", "| report | seed | method | " + " | ".join(f"{o} (tail run)" for o in orders) + " |",
              "|---|---:|---|" + "---:|" * len(orders)]
    cells: dict = {}
    for r in result["rows"]:
        cells.setdefault((r["report"], r["seed"], r["method"]), {}).setdefault(r["order"], []).append(r)
    for (report, seed, method), by in cells.items():
        lines.append(f"| {report} | {seed} | {method} | " + " | ".join(_order_cell(by[o]) for o in orders) + " |")
    return "\n".join(lines)


def _order_cell(rows: list[dict]) -> str:
    acc = [r["test_accuracy"] for r in rows]
    if len(rows) == 1:
        return f"{100 * acc[0]:.1f} ({rows[0]['tail_run']})"
    runs = [r["tail_run"] for r in rows]
    return f"{100 * np.mean(acc):.1f} ± {100 * np.std(acc):.1f} ({min(runs)}-{max(runs)})"
