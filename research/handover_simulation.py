"""How often the hand-over check replaces a pick, by simulation on stored per-example correctness.

    python research/handover_simulation.py docs/results/prompt-correctness-rotten_tomatoes-k20.json OUT.json \
        --sizes 64 128 256 --random 8 16 --draws 400

Every simulated check resamples the stored validation correctness of real random prompts
(``research/prompt_correctness.py``): ``n`` examples drawn with replacement, ``R + 1`` prompts
drawn, and on each example their answers permuted among the prompts, so that every prompt is
equally good in expectation while each example keeps its difficulty. The first prompt is the
pick, the others the random prompts. Two scenarios:

- **equal**: nothing else; a replacement is a false alarm;
- **better**: one more candidate, another permuted prompt with wrong answers turned right until
  its accuracy is the pick's plus ``--gain`` (0.10): a hand-over of it is a detection.

For each, the share of draws in which the current rule (:func:`icl_ssm.select.check.hand_over`)
replaces the pick / hands over the better candidate, and the same for the rule it replaced
(kept when above the median random prompt, else the best checked prompt when a paired bootstrap
interval of its gain on the same examples excludes 0; re-implemented here for the comparison).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from icl_ssm import atomic
from icl_ssm.evaluate.stats import paired_bootstrap
from icl_ssm.select.check import compare_prompts, hand_over


def draw_check(correct: np.ndarray, n: int, prompts: int, rng: np.random.Generator) -> np.ndarray:
    """``(prompts, n)`` 0/1: ``n`` resampled examples, ``prompts`` resampled prompts, each example's
    answers permuted among the prompts (every prompt equally good in expectation)."""
    rows = rng.choice(correct.shape[0], prompts, replace=prompts > correct.shape[0])
    cols = rng.integers(0, correct.shape[1], n)
    grid = correct[np.ix_(rows, cols)].copy()
    for j in range(n):
        grid[:, j] = grid[rng.permutation(prompts), j]
    return grid


def plant_gain(pick: np.ndarray, other: np.ndarray, gain: float, rng: np.random.Generator) -> np.ndarray:
    """``other`` with wrong answers turned right until its accuracy is the pick's plus ``gain``."""
    out = other.copy()
    need = int(round((pick.mean() + gain) * len(out))) - int(out.sum())
    wrong = np.flatnonzero(out == 0)
    if need > 0:
        out[rng.choice(wrong, min(need, len(wrong)), replace=False)] = 1
    return out


def old_rule(result: dict, preferred: str) -> str:
    """The rule before the simultaneous bound: keep above the median random prompt, else the best
    checked prompt when its paired interval against the pick (same examples) excludes 0."""
    rows = result["prompts"]
    mine = rows[preferred]
    if mine["accuracy"] > result["random_median"]:
        return preferred
    options = {n: r for n, r in rows.items() if n not in (preferred, "zero-shot")}
    options |= {f"random-{i}": r for i, r in enumerate(result["random"])}
    best = max(options, key=lambda n: options[n]["accuracy"])
    gain = np.asarray(options[best]["correct"], float) - np.asarray(mine["correct"], float)
    return best if paired_bootstrap(gain)["ci95"][0] > 0 else preferred


def simulate(correct: np.ndarray, n: int, random: int, draws: int, gain: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    counts = {"equal_new": 0, "equal_old": 0, "better_new": 0, "better_old": 0}
    for _ in range(draws):
        grid = draw_check(correct, n, random + 2, rng)
        pick, others, extra = grid[0], grid[1:-1], grid[-1]
        randoms = [{"indices": [], "correct": r.tolist()} for r in others]
        for scenario in ("equal", "better"):
            prompts = {"pick": {"indices": [], "correct": pick.tolist()}}
            if scenario == "better":
                prompts["better"] = {"indices": [], "correct": plant_gain(pick, extra, gain, rng).tolist()}
            result = compare_prompts(prompts, [dict(r) for r in randoms])
            new = hand_over(result, "pick")["name"]
            old = old_rule(result, "pick")
            if scenario == "equal":
                counts["equal_new"] += new != "pick"
                counts["equal_old"] += old != "pick"
            else:
                counts["better_new"] += new == "better"
                counts["better_old"] += old == "better"
    return {"check_size": n, "random_prompts": random, "draws": draws, "gain": gain,
            **{f"{k}_rate": v / draws for k, v in counts.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("record")
    ap.add_argument("out")
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--random", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--draws", type=int, default=400)
    ap.add_argument("--gain", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    record = json.loads(open(args.record).read())
    correct = np.array([p["validation_correct"] for p in record["prompts"]], dtype=np.float64)
    t0 = time.perf_counter()
    rows = []
    for n in args.sizes:
        for r in args.random:
            rows.append(simulate(correct, n, r, args.draws, args.gain, args.seed))
            print(json.dumps(rows[-1]), flush=True)
    atomic.write_json(args.out, {
        "command": "python research/handover_simulation.py " + args.record + " OUT --sizes "
                   + " ".join(map(str, args.sizes)) + " --random " + " ".join(map(str, args.random))
                   + f" --draws {args.draws} --gain {args.gain} --seed {args.seed}",
        "source": args.record, "source_prompts": int(correct.shape[0]), "source_examples": int(correct.shape[1]),
        "rows": rows, "seconds": time.perf_counter() - t0})


if __name__ == "__main__":
    main()
