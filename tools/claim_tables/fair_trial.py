"""The SSM's fair trial (docs/research/fair-trial.md): which cheap ranker carries the subset ranking
once the label lean is out."""

from __future__ import annotations

from collections.abc import Callable

from claim_tables.adapt import as_record
from claim_tables.base import Records, ci, table
from claim_tables.render import Column, render
from icl_ssm.records import Record

RANKERS = "fair-trial/rankers-k20-96x64.json"
ORDER = ("cache: compressed", "cache: control", "cache: window", "label statistics", "dense 4+4",
         "dense, lean left in")


def fair_trial_rankers(records: Records, depth: int = 2) -> str:
    data = records(RANKERS)
    rows, notes = [], []
    for r in data["records"]:
        by = {s["ranker"]: s for s in r["spearman"]}
        pair = {(p["ranker"], p["minus"]): p for p in r["paired"]}
        vs = pair.get(("cache: compressed", "cache: control"))
        rows.append([r["task"], *[("-" if by.get(n) is None else f"{by[n]['spearman']:.2f} {ci(by[n]['ci95'])}")
                                  for n in ORDER],
                     "-" if vs is None else f"{vs['difference']:+.2f} {ci(vs['ci95'], '+.2f')}",
                     f"{r['target_split_half']:.2f} ({r['target_reliability']:.2f})"])
        notes.append(f"{r['task']}: {r['subsets']} subsets x {r['queries']['target']} target queries "
                     f"(+ {r['queries']['probe']} probe)")
    header = ["task", "compressed (shipped k = 20)", "control (prompt-blind)", "window (same slots)",
              "label statistics (0 parameters)", "dense on 4+4 probe queries", "dense, lean left in",
              "compressed minus control", "target split-half (reliability)"]
    return (table(header, rows) + "\n\nSpearman against the dense prompt's label-balanced loss with the lean removed "
            "(batch calibration on the target queries); 95% bootstrap intervals resample subsets and, within each "
            f"label, the queries. {'; '.join(notes)}. {records.link(RANKERS, depth)}")


# the content task's headroom after calibration as the prompt grows: k = 20, then the long-context records
LONG_CONTEXT = ("calibration/headroom-k20-foobar-seed0.json", "fair-trial/headroom-k*-foobar-seed0.json",
                "fair-trial/headroom-k*-rotten_tomatoes-seed0.json")


def _spread(m: str) -> Callable[[Record], str]:
    return lambda r: ("-" if r[f"{m}.min"].value is None else
                      f"{r[f'{m}.median'].value:.3f} ({r[f'{m}.min'].value:.3f}-{r[f'{m}.max'].value:.3f})")


def _cost(r: Record) -> str:
    seconds, tokens = r["dense_seconds"].value, r["prompt_tokens"].value
    return "-" if seconds is None else f"{seconds:.1f} s ({tokens:.0f} tokens)"


LONG_COLUMNS = [
    Column("task", config="task"), Column("k", config="k"), Column("pool", config="pool_size"),
    Column("one dense pass per prompt (prompt length)", cell=_cost),
    Column("raw: median (min-max)", cell=_spread("none")),
    Column("batch-calibrated: median (min-max)", cell=_spread("batch")),
    Column("calibrated: validation-test Spearman", "batch.spearman", fmt="rho"),
    Column("calibrated: validation split-half", "batch.split_half", fmt="rho"),
    Column("best on validation minus median (points)", "batch.best_minus_median", fmt="points"),
    Column("calibrated zero-shot", "batch.zero_shot"),
    Column("record", cell=lambda r: f"[record](../results/{r.name})"),
]


def fair_trial_long_context(records: Records) -> str:
    """The content task's headroom after calibration at k = 20, 100 and 200 (one renderer, one adapter)."""
    names = [LONG_CONTEXT[0]] + [f"fair-trial/{name}" for pattern in LONG_CONTEXT[1:]
                                 for name, _ in records.glob(pattern)]
    read = sorted((as_record(name, records(name)) for name in names), key=lambda r: (r.config["task"], r.config["k"]))
    first = read[0].config
    return (render(read, LONG_COLUMNS) + f"\n\n{first['prompts']} random prompts per row (the same seed), "
            f"{first['validation']} validation inputs and {first['test_size']} test examples; accuracies as shares. "
            "The dense pass reads the validation and test inputs and the content-free and domain inputs after one "
            "prompt (2-core CPU, nothing else running); its seconds are the median over the prompts.")
