"""Re-derive, from finished `icl-ssm bench trust` runs, what icl_ssm.select.check.hand_over as it
is now would hand over from each run's stored check (the check examples' answers of every
prompt), where that prompt stands on the test split against the run's random prompts, and whether
today's check warns (the pick not shown above the median random prompt by a paired interval).

    python research/rehandover.py runs/trust

A prompt whose test accuracy the run did not measure (a random prompt of the check that was not
handed over then) is reported as unmeasured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from icl_ssm.select.check import hand_over


def main(root: str) -> list[dict]:
    trust = json.loads((Path(root) / "trust.json").read_text())
    out = []
    for row in trust["runs"]:
        run = Path(root) / f"{Path(row['task']).stem}-s{row['seed']}"
        check = json.loads((run / "stages" / "check.json").read_text())["result"]
        report = json.loads((run / "report.json").read_text())
        name, indices, reason = hand_over(check, check["preferred"])
        mine = check["prompts"][check["preferred"]]
        shown = mine["accuracy"] > check["random_median"] and mine["vs_median_interval"][0] > 0
        tested = {tuple(s["indices"]): s["test_accuracy"] for s in report["selections"] if s["indices"]}
        tested[tuple(report["handed_over"]["indices"])] = row["handed_test_accuracy"]
        acc = tested.get(tuple(indices))
        rand = np.asarray(row["random_test_accuracies"])
        out.append({"task": row["task"], "seed": row["seed"], "then": row["handed_over"], "now": name,
                    "test_accuracy": acc, "random_median": float(np.median(rand)),
                    "at_or_above_median": None if acc is None else bool(acc >= np.median(rand)),
                    "below_p25": None if acc is None else bool(acc < np.percentile(rand, 25)),
                    "warned": not shown, "reason": reason})
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/trust")
