"""``icl-ssm bench headroom --calibrations ...``: what there is to select once the label lean is out.

Random ``k``-prompts of one pool, each scored once on validation inputs, on test examples and on
the content-free and in-domain inputs the calibrations read; every calibration
(:mod:`icl_ssm.calibrate`) is then applied to the stored label scores, so all methods see the same
prompts and answers. Per method it reports the spread of the prompts' test accuracies, whether
their validation accuracy predicts their test accuracy (Spearman over prompts), the test
accuracy of the prompt best on validation, and the split-half reliability of the validation
ranking (no test label read). Zero-shot is scored the same way.

Two further rows per task: ``batch-inputs`` re-estimates batch calibration on the test inputs
themselves (what ``icl-ssm answer --calibrate batch`` does on a user's file); with
``imbalance`` the test examples are drawn so that the first label holds that share, to see what
each method does when the inputs lean one way.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from icl_ssm.calibrate import CALIBRATORS, NONE, get_calibrator
from icl_ssm.cost import measure
from icl_ssm.data.tasks import Example
from icl_ssm.evaluate.stats import paired_bootstrap, spearman, spearman_brown, split_half_spearman
from icl_ssm.lm.prompts import PromptBuilder
from icl_ssm.select.held_out import prompt_scores
from icl_ssm_bench.headroom import classification_splits

METHODS = (NONE, *sorted(CALIBRATORS))
ON_INPUTS = "batch-inputs"  # batch calibration re-estimated on the scored inputs themselves
FOLDS = 2  # a method fitted on validation labels is scored on validation by cross-fitting


@dataclass
class CalibrationHeadroomConfig:
    """What ``bench headroom --calibrations`` measures: ``prompts`` random ``k``-prompts per task
    (plus zero-shot), ``validation`` validation inputs and ``test_size`` test examples;
    ``imbalance``: the first label's share of the test examples (None: as drawn)."""

    tasks: tuple[str, ...] = ("rotten_tomatoes", "cr")
    k: int = 20
    prompts: int = 12
    pool_size: int = 100
    validation: int = 64
    test_size: int = 150
    seed: int = 0
    methods: tuple[str, ...] = METHODS
    imbalance: float | None = None
    query_batch: int = 32

    def validate(self) -> None:
        if self.prompts < 3:
            raise ValueError(f"--sets {self.prompts}; expected >= 3 (a rank correlation over prompts)")
        if self.k < 1:
            raise ValueError(f"--k {self.k}; expected >= 1")
        if self.validation < 4:
            raise ValueError(f"--validation {self.validation}; expected >= 4 (two halves of two labels)")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"--calibrations {' '.join(unknown)}; accepted: {', '.join(METHODS)}")
        if self.imbalance is not None and not 0 < self.imbalance < 1:
            raise ValueError(f"--imbalance {self.imbalance}; expected the first label's share, in (0, 1)")


def imbalanced(examples: Sequence[Example], labels: Sequence[str], share: float, size: int) -> list[Example]:
    """``size`` examples (fewer where the data runs out) with ``labels[0]`` holding ``share`` of them
    and the other labels the rest in equal parts, each label's in their given order."""
    by = {lab: [e for e in examples if e.target == lab] for lab in labels}
    want = {labels[0]: round(share * size)}
    rest = size - want[labels[0]]
    for j, lab in enumerate(labels[1:]):
        want[lab] = rest // (len(labels) - 1) + (j < rest % (len(labels) - 1))
    scale = min(1.0, *(len(by[lab]) / want[lab] for lab in labels if want[lab]))
    picked = [e for lab in labels for e in by[lab][: int(want[lab] * scale)]]
    order = {e.id: i for i, e in enumerate(examples)}
    return sorted(picked, key=lambda e: order[e.id])


def biases(logp_val: torch.Tensor, gold_val: torch.Tensor, logp_test: torch.Tensor,
           extra: dict[str, torch.Tensor], methods: Sequence[str]) -> dict[str, torch.Tensor]:
    """Each method's bias ``(L,)`` for one prompt, from label log-probabilities: ``logp_val (V, L)``
    with ``gold_val (V,)``, ``logp_test (T, L)`` and the content-free / in-domain inputs'
    ``extra[method] (n, L)``."""
    out = {}
    for m in methods:
        if m == NONE:
            out[m] = torch.zeros(logp_val.shape[1], dtype=logp_val.dtype)
        elif m in extra:
            out[m] = get_calibrator(m).fit(extra[m], None)
        else:
            out[m] = get_calibrator(m).fit(logp_val, gold_val if get_calibrator(m).needs_labels else None)
    out[ON_INPUTS] = get_calibrator("batch").fit(logp_test, None)
    return out


def cross_fitted(logp_val: torch.Tensor, gold_val: torch.Tensor, method: str) -> torch.Tensor:
    """``(V,)`` validation predictions of a method fitted on labels, each fold's from a bias fitted
    on the other folds (so its validation accuracy is not measured on what it was fitted to). The
    folds are label-stratified: each label's examples alternate between them."""
    pred = torch.empty(len(gold_val), dtype=torch.long)
    fold = torch.empty(len(gold_val), dtype=torch.long)
    for label in gold_val.unique():
        at = (gold_val == label).nonzero()[:, 0]
        fold[at] = torch.arange(len(at)) % FOLDS
    for f in range(FOLDS):
        bias = get_calibrator(method).fit(logp_val[fold != f], gold_val[fold != f])
        pred[fold == f] = (logp_val[fold == f] - bias).argmax(-1)
    return pred


def prompt_rows(logp_val, gold_val, logp_test, gold_test, extra, methods) -> dict[str, dict[str, object]]:
    """Per method: the prompt's validation correctness (cross-fitted where it reads labels) and its
    test correctness, 0/1 lists."""
    rows = {}
    for m, bias in biases(logp_val, gold_val, logp_test, extra, methods).items():
        if m == ON_INPUTS:
            val = None
        elif m != NONE and get_calibrator(m).needs_labels:
            val = (cross_fitted(logp_val, gold_val, m) == gold_val).int().tolist()
        else:
            val = ((logp_val - bias).argmax(-1) == gold_val).int().tolist()
        rows[m] = {"bias": bias.tolist(), "validation_correct": val,
                   "test_correct": ((logp_test - bias).argmax(-1) == gold_test).int().tolist()}
    return rows


def summarize_method(val: np.ndarray | None, test: np.ndarray, val_labels: np.ndarray) -> dict[str, object]:
    """One method over ``P`` prompts: ``val (P, V)`` and ``test (P, T)`` 0/1 correctness
    (``val`` None for a method with no validation score). The spread of test accuracies; the
    Spearman of validation with test accuracy over prompts; the test accuracy of the prompt best
    on validation and its paired difference from the median prompt's (bootstrap over the test
    examples); the split-half Spearman of the validation accuracies (label-stratified halves) and
    its Spearman-Brown reliability."""
    acc = test.mean(1)
    median = int(np.argsort(acc)[len(acc) // 2])
    out: dict[str, object] = {"test_accuracy": acc.tolist(), "median": float(np.median(acc)), "mean": float(acc.mean()),
                              "std": float(acc.std()), "min": float(acc.min()), "max": float(acc.max())}
    if val is None:
        return out
    v = val.mean(1)
    best = int(np.argmax(v))
    half = split_half_spearman(-val.astype(float), val_labels)  # losses: 1 - correct ranks as -correct
    out.update(validation_accuracy=v.tolist(), validation_test_spearman=_finite(spearman(v, acc)),
               best_on_validation=best, best_on_validation_test=float(acc[best]),
               best_minus_median=paired_bootstrap(test[best] - test[median]),
               validation_split_half=_finite(half),
               validation_reliability=_finite(spearman_brown(half) if math.isfinite(half) and half > 0 else
                                              (0.0 if math.isfinite(half) else math.nan)))
    return out


def calibration_headroom(cfg: CalibrationHeadroomConfig, model, tokenizer, log=print) -> dict:
    """The study (see the module) on a loaded model; returns the record's body."""
    cfg.validate()
    todo = classification_splits(cfg.tasks, cfg.k, cfg.pool_size, cfg.seed, "calibration reads label scores")
    for name, _, splits in todo:
        if len(splits.validation) < cfg.validation:
            raise ValueError(f"--validation {cfg.validation}: {name}'s validation split holds {len(splits.validation)}")
    tasks = {}
    for name, task, splits in todo:
        builder = PromptBuilder.for_model(model, tokenizer, task)
        labels = list(task.labels)
        val = splits.validation[: cfg.validation]
        test = (imbalanced(splits.test, labels, cfg.imbalance, cfg.test_size) if cfg.imbalance is not None
                else splits.test[: cfg.test_size])
        gold_val = torch.tensor([builder.label_index(e) for e in val])
        gold_test = torch.tensor([builder.label_index(e) for e in test])
        rng = np.random.default_rng(cfg.seed)
        extra_inputs = {m: get_calibrator(m).inputs(splits.pool, rng) for m in cfg.methods
                        if m in ("contextual", "domain")}
        prompts = [[]] + [[int(i) for i in rng.choice(len(splits.pool), size=cfg.k, replace=False)]
                          for _ in range(cfg.prompts)]
        rows = []
        for j, idx in enumerate(prompts):
            demos = [splits.pool[i] for i in idx]
            read = [*val, *test, *(e for v in extra_inputs.values() for e in v)]
            with measure(model.device, count_flops=False) as cost:  # wall seconds (counting FLOPs slows the pass)
                scores = prompt_scores(model, builder, demos, read, query_batch=cfg.query_batch).double()
            logp = torch.log_softmax(scores, dim=-1)
            logp_val, logp_test = logp[: len(val)], logp[len(val): len(val) + len(test)]
            extra, at = {}, len(val) + len(test)
            for m, inputs in extra_inputs.items():
                extra[m], at = logp[at: at + len(inputs)], at + len(inputs)
            methods = prompt_rows(logp_val, gold_val, logp_test, gold_test, extra, cfg.methods)
            rows.append({"indices": idx, "labels": dict(Counter(splits.pool[i].target for i in idx)),
                         "methods": methods, "prompt_tokens": len(builder.build_prefix(demos).input_ids),
                         "inputs": len(read), "seconds": cost.seconds})
            line = ", ".join(f"{m} {np.mean(r['test_correct']):.3f}" for m, r in methods.items())
            log(f"{name} {'zero-shot' if not idx else f'prompt {j}'}: test {line}")
        val_labels = gold_val.numpy()
        summary, shots = {}, rows[1:]
        for m in [*cfg.methods, ON_INPUTS]:
            v = None if shots[0]["methods"][m]["validation_correct"] is None else np.array(
                [r["methods"][m]["validation_correct"] for r in shots], dtype=float)
            t = np.array([r["methods"][m]["test_correct"] for r in shots], dtype=float)
            summary[m] = summarize_method(v, t, val_labels) | {
                "zero_shot": float(np.mean(rows[0]["methods"][m]["test_correct"]))}
        cost = {"median_seconds": float(np.median([r["seconds"] for r in shots])),
                "median_prompt_tokens": float(np.median([r["prompt_tokens"] for r in shots])),
                "inputs_per_prompt": shots[0]["inputs"]}  # one dense pass per prompt over these inputs
        log(f"{name}: a k = {cfg.k} prompt of {cost['median_prompt_tokens']:.0f} tokens (median) read "
            f"{cost['inputs_per_prompt']} inputs in {cost['median_seconds']:.1f} s (median over {len(shots)} prompts)")
        tasks[name] = {"validation_ids": [e.id for e in val], "test_ids": [e.id for e in test], "dense_pass": cost,
                       "test_labels": dict(Counter(e.target for e in test)), "summary": summary, "prompts": rows}
    return {"config": asdict(cfg), "tasks": tasks}


def calibration_markdown(result: dict) -> str:
    cfg = result["config"]
    lines = [f"k = {cfg['k']}, {cfg['prompts']} random prompts, {cfg['validation']} validation inputs, test as below "
             f"(imbalance {cfg['imbalance']}); accuracies in %.", "",
             "| task | calibration | zero-shot | random prompts: median (sd) | min - max | best on validation -> test "
             "| best minus median [95% CI over test examples] | validation-test Spearman | validation split-half |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, t in result["tasks"].items():
        for m, s in t["summary"].items():
            best = (f"{100 * s['best_on_validation_test']:.1f}" if "best_on_validation_test" in s else "-")
            diff = s.get("best_minus_median")
            diff = f"{100 * diff['mean']:+.1f} [{100 * diff['ci95'][0]:+.1f}, {100 * diff['ci95'][1]:+.1f}]" \
                if diff else "-"
            lines.append(f"| {name} ({sum(t['test_labels'].values())}) | {m} | {100 * s['zero_shot']:.1f} | "
                         f"{100 * s['median']:.1f} ({100 * s['std']:.1f}) | "
                         f"{100 * s['min']:.1f} - {100 * s['max']:.1f} | {best} | {diff} | "
                         f"{_num(s.get('validation_test_spearman'))} | {_num(s.get('validation_split_half'))} |")
    for name, t in result["tasks"].items():
        if t.get("dense_pass"):
            c = t["dense_pass"]
            lines.append(f"\n{name}: one dense pass per prompt ({c['median_prompt_tokens']:.0f} prompt tokens, "
                         f"{c['inputs_per_prompt']} inputs): {c['median_seconds']:.1f} s (median over the prompts)")
    return "\n".join(lines)


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
