"""The SSM's fair trial (docs/research/fair-trial.md): which cheap ranker carries the subset ranking
once the label lean is out."""

from __future__ import annotations

from claim_tables.base import Records, ci, table

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
