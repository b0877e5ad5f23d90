"""How often the hand-over check replaces a pick, by simulation on stored per-example correctness.

    python research/handover_simulation.py docs/results/prompt-correctness-rotten_tomatoes-k20.json OUT.json \
        --sizes 64 128 256 --random 8 16 --draws 400

Every simulated check resamples the stored validation correctness of real random prompts
(``research/prompt_correctness.py``): ``R + 2`` stored prompts drawn, each set to the first one's
accuracy on the stored examples by flipping a few random answers (so they are equally good there
and keep their real agreement with one another), then ``n`` examples drawn with replacement. The
first prompt is the pick, the next ``R`` the random prompts. Two scenarios:

- **equal**: nothing else; a replacement is a false alarm;
- **better**: one more candidate, set to the pick's accuracy plus ``--gain`` (0.10) on the stored
  examples: a hand-over of it is a detection.

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


def set_accuracy(correct: np.ndarray, accuracy: float, rng: np.random.Generator) -> np.ndarray:
    """``correct`` (0/1) with randomly chosen answers flipped until its mean is ``accuracy``
    (right ones turned wrong when it is above, wrong ones turned right when below)."""
    out = correct.copy()
    need = int(round(accuracy * len(out))) - int(out.sum())
    pool = np.flatnonzero(out == (0 if need > 0 else 1))
    out[rng.choice(pool, min(abs(need), len(pool)), replace=False)] = 1 if need > 0 else 0
    return out


def draw_check(correct: np.ndarray, n: int, prompts: int, rng: np.random.Generator,
               gain: float | None = None) -> np.ndarray:
    """``(prompts, n)`` 0/1 answers on ``n`` examples resampled from the stored ones: ``prompts``
    stored prompts drawn, every one set to the first one's accuracy on the stored examples
    (:func:`set_accuracy`), so that all are equally good there while each keeps most of its own
    answers (and so its real agreement with the others); with ``gain``, the last one is set to
    the first one's accuracy plus ``gain`` instead."""
    rows = rng.choice(correct.shape[0], prompts, replace=prompts > correct.shape[0])
    grid = correct[rows].copy()
    target = grid[0].mean()
    for j in range(1, prompts):
        grid[j] = set_accuracy(grid[j], target + (gain if gain is not None and j == prompts - 1 else 0.0), rng)
    return grid[:, rng.integers(0, correct.shape[1], n)]


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
        for scenario in ("equal", "better"):
            grid = draw_check(correct, n, random + 2, rng, gain=gain if scenario == "better" else None)
            prompts = {"pick": {"indices": [], "correct": grid[0].tolist()}}
            if scenario == "better":
                prompts["better"] = {"indices": [], "correct": grid[-1].tolist()}
            randoms = [{"indices": [], "correct": r.tolist()} for r in grid[1:-1]]
            result = compare_prompts(prompts, randoms)
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
