"""The SSM's fair trial (docs/research/fair-trial.md): which cheap ranker carries the subset ranking
once the label lean is out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from claim_tables.adapt import read
from claim_tables.base import Records
from claim_tables.render import Column, render
from icl_ssm.records import Record

RANKERS = "fair-trial/rankers-k20-96x64.json"


def _split_half(r: Record) -> str:
    return f"{r['target_split_half'].value:.2f} ({r['target_reliability'].value:.2f})"


RANKER_COLUMNS = [
    Column("task", config="part"),
    *[Column(header, f"spearman.{key}", fmt="rho") for header, key in (
        ("compressed (shipped k = 20)", "compressed"), ("control (prompt-blind)", "control"),
        ("window (same slots)", "window"), ("label statistics (0 parameters)", "label_statistics"),
        ("dense on 4+4 probe queries", "dense_probe"), ("dense, lean left in", "dense_lean_in"))],
    Column("compressed minus control", "compressed_minus_control", fmt=lambda x: f"{x:+.2f}"),
    Column("target split-half (reliability)", cell=_split_half),
]


def fair_trial_rankers(records: Records, depth: int = 2) -> str:
    """Per task, each cheap ranker's Spearman with the dense ranking once the lean is out (one renderer, one
    adapter: the rows are the record's tasks)."""
    record = read(records, RANKERS)
    rows = [record.part(task) for task in record.config["parts"]]
    notes = [f"{task}: {s['subsets']} subsets x {s['target_queries']} target queries (+ {s['probe_queries']} probe)"
             for task, s in record.config["parts"].items()]
    return (render(rows, RANKER_COLUMNS) + "\n\nSpearman against the dense prompt's label-balanced loss with the lean "
            "removed (batch calibration on the target queries); 95% bootstrap intervals resample subsets and, within "
            f"each label, the queries. {'; '.join(notes)}. {records.link(RANKERS, depth)}")


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
    rows = sorted((read(records, name) for name in names), key=lambda r: (r.config["task"], r.config["k"]))
    first = rows[0].config
    return (render(rows, LONG_COLUMNS) + f"\n\n{first['prompts']} random prompts per row (the same seed), "
            f"{first['validation']} validation inputs and {first['test_size']} test examples; accuracies as shares. "
            "The dense pass reads the validation and test inputs and the content-free and domain inputs after one "
            "prompt (2-core CPU, nothing else running); its seconds are the median over the prompts.")


# research/per_demo_ranker.py: learned linear readouts of per-demonstration encodings against learned label counts
PER_DEMO = "fair-trial/per-demo-ranker-k20.json"
PER_DEMO_COLUMNS = [
    Column("task", config="part"), Column("subsets", config="subsets"), Column("pool", config="pool"),
    Column("per-demonstration encodings (32 features)", "spearman.encodings", fmt="rho"),
    Column("label counts (4 features)", "spearman.label_counts", fmt="rho"),
    Column("both", "spearman.both", fmt="rho"),
    Column("encodings minus label counts", "encodings_minus_label_counts", fmt="diff"),
]


def fair_trial_per_demo(records: Records, depth: int = 2) -> str:
    """Per task, the out-of-fold Spearman of ridge readouts of per-demonstration encodings and of label counts
    with the dense ranking once the lean is out (one renderer, one adapter: the rows are the record's tasks)."""
    record = read(records, PER_DEMO)
    rows = [replace(record.part(task), config={**record.config["parts"][task], "part": task})
            for task in record.config["parts"]]
    return (render(rows, PER_DEMO_COLUMNS) + "\n\nSpearman of each subset's out-of-fold prediction (8 folds, the "
            "ridge penalty chosen inside each) with the dense prompt's label-balanced loss with the lean removed, "
            f"section 2's target. {records.link(PER_DEMO, depth)}")
