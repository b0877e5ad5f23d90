"""Train or evaluate compressors whose SSM summary is replaced by the prompt's true label statistics.

    python research/oracle_summary.py FEATURES distill --task rotten_tomatoes --k 50 --out DIR
    python research/oracle_summary.py fidelity --task rotten_tomatoes --k 50 --compressor DIR ...
    python research/oracle_summary.py targets TEACHER_CACHE_DIR

FEATURES is a comma list of ``share`` (share of each label word among the label words the
summary reads), ``last`` (the label of the last demonstration it reads) and ``last4`` (the
label share of the last four it reads). The rest is an ordinary ``icl-ssm`` command line, run
with :meth:`SSMCompressor.states` replaced, for the compressor being trained (``distill``) or
any loaded one whose folder holds an ``ORACLE`` file naming its features (written by
``distill`` here), unless it is a control, by

    state = constant + features @ P

where ``constant`` is the control's learned state and ``P`` a fixed random projection
(seed 0, unit-variance entries, not trained). Such a compressor is its control plus the label
statistics that rank subsets (BENCHMARKS.md: the label share ranks Rotten Tomatoes subsets at
k = 50 with Spearman 0.62 against the dense loss), handed to it exactly: it asks whether the
distillation would use the right summary if the SSM gave it. If it ranks subsets no better than
its control, the SSM is not what limits the ranking; the training signal is.

Label words are found by comparing the token embeddings the compressor reads with the
embeddings of each verbaliser's first token (the task's labels must differ there), so the
header's mention of each label counts once for every prompt alike. Other compressors (no
``ORACLE`` file) keep their SSM, so one ``fidelity`` run can hold oracles and ordinary
compressors side by side. Do not load an oracle's weights with plain ``icl-ssm``: they read a
state the SSM does not produce.

``targets`` asks the same question of the training signal alone: how much of the ranking term's
target (each query's gold-answer NLL, centred over the subsets of its group, as
``distill.rank_loss`` uses it) a least-squares fit on the label statistics explains, per query
(the statistics times the query's label sign: a share of positive labels helps positive
queries and hurts negative ones) and per subset mean (what selection ranks by).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import torch

from icl_ssm import cli
from icl_ssm.compress.compressor import SSMCompressor
from icl_ssm.data.splits import split
from icl_ssm.data.tasks import get_task
from icl_ssm.lm.models import load_model
from icl_ssm.lm.prompts import PromptBuilder

FEATURES = ("share", "last", "last4")


def label_features(embeds: torch.Tensor, mask: torch.Tensor | None, label_embeds: torch.Tensor,
                   names: list[str]) -> torch.Tensor:
    """``embeds (B, T, H)``, ``mask (B, T)``, ``label_embeds (L, H)`` -> features ``(B, len(names))``,
    each centred on the value of a balanced prompt. With L labels, "label" means its index / (L - 1)."""
    B, T, _ = embeds.shape
    L = label_embeds.shape[0]
    hit = (embeds[:, :, None, :] == label_embeds[None, None].to(embeds.dtype)).all(-1)  # (B, T, L)
    if mask is not None:
        hit &= mask[..., None].bool()
    value = torch.linspace(0, 1, L, dtype=torch.float64)  # a label's numeric value
    found = hit.any(-1)  # (B, T)
    label_at = hit.double().argmax(-1)  # (B, T): which label, where found
    out = []
    for b in range(B):
        seq = value[label_at[b][found[b]]]  # labels read, in prompt order
        if len(seq) == 0:
            raise ValueError("oracle: no label word among the tokens the summary reads")
        feats = {"share": seq.mean(), "last": seq[-1], "last4": seq[-4:].mean()}
        out.append(torch.stack([feats[n] - 0.5 for n in names]))
    return torch.stack(out).to(embeds.dtype)


def explained(groups: list[dict]) -> dict[str, float]:
    """In-sample R^2 of the centred rank targets on label statistics.

    Each group: ``nll (S, Q)`` (dense gold NLL of S subsets on the same Q queries), ``labels
    (S, k)`` (the demonstrations' label values in prompt order, 0..1), ``query (Q,)`` (the
    queries' label values). Returns R^2 per query (on share, last and last-4 share, each times
    the query's sign, plus share and imbalance) and per subset mean (on imbalance, share, last).
    """
    Xq, Yq, Xs, Ys = [], [], [], []
    for g in groups:
        nll, lab, sign = np.asarray(g["nll"], float), np.asarray(g["labels"], float), 2 * np.asarray(g["query"]) - 1
        stats = np.stack([lab.mean(1), lab[:, -1], lab[:, -4:].mean(1), np.abs(lab.mean(1) - 0.5)], 1)
        stats -= stats.mean(0)  # centred over the group's subsets, as the target is
        d = nll - nll.mean(0)
        for s in range(len(nll)):
            for j in range(nll.shape[1]):
                Xq.append([*(stats[s, :3] * sign[j]), stats[s, 0], stats[s, 3]])
                Yq.append(d[s, j])
        m = nll.mean(1)
        Xs += [[stats[s, 3], stats[s, 0], stats[s, 1]] for s in range(len(nll))]
        Ys += list(m - m.mean())

    def r2(X, Y) -> float:
        X, Y = np.asarray(X), np.asarray(Y)
        coef = np.linalg.lstsq(X, Y, rcond=None)[0]
        return float(1 - ((Y - X @ coef) ** 2).sum() / (Y**2).sum())

    return {"per_query_r2": r2(Xq, Yq), "per_query_var": float(np.var(Yq)),
            "per_subset_r2": r2(Xs, Ys), "per_subset_var": float(np.var(Ys)), "points": len(Yq)}


def targets(directory: str) -> None:
    from icl_ssm.distill.teacher import TeacherCache

    cache = TeacherCache.open(directory)
    if len(cache.spec.tasks) != 1:
        raise SystemExit("oracle targets: a teacher cache of one task")
    task = get_task(cache.spec.tasks[0])
    pool = split(task, seed=cache.spec.seed).pool
    value = {label: i / max(1, len(task.labels) - 1) for i, label in enumerate(task.labels)}
    groups: dict[int, dict] = {}
    for i, ep in enumerate(cache.episodes):
        g = groups.setdefault(ep.group, {"nll": [], "labels": [], "query": [value[pool[j].target] for j in ep.queries]})
        nll = -cache.get(i)["gold_logp"].double().numpy()
        g["nll"].append(nll)
        g["labels"].append([value[pool[j].target] for j in ep.demos])
    r = explained(list(groups.values()))
    print(f"{task.name}, k = {cache.spec.k}, {len(groups)} groups: centred rank target explained by label statistics\n")
    print("| level | target variance | R^2 (in-sample least squares) |\n|---|---:|---:|")
    print(f"| per query (what `--rank-level query` fits) | {r['per_query_var']:.4f} | {r['per_query_r2']:.3f} |")
    print(f"| per subset mean | {r['per_subset_var']:.4f} | {r['per_subset_r2']:.3f} |")


def oracle_features(compressor: SSMCompressor, training: list[str] | None) -> list[str] | None:
    """The features a compressor reads instead of its SSM state, or None for an ordinary one."""
    if compressor.config.control:
        return None
    if training is not None:  # distill: the one compressor it trains
        return training
    if not hasattr(compressor, "_oracle"):  # read the marker once per compressor, not per forward
        marker = Path(getattr(compressor.config, "_name_or_path", "") or "/nonexistent") / "ORACLE"
        compressor._oracle = parse(marker.read_text().strip()) if marker.is_file() else None
    return compressor._oracle


@functools.cache
def projection(features: int, size: int) -> torch.Tensor:
    """The fixed random map from the label statistics to the state (seed 0, not trained)."""
    return torch.randn(features, size, generator=torch.Generator().manual_seed(0))


def parse(spec: str) -> list[str]:
    names = spec.split(",")
    if any(n not in FEATURES for n in names):
        raise SystemExit(f"oracle: FEATURES must be a comma list of {FEATURES}, got {spec!r}")
    return names


def install(model_name: str, task_name: str, training: list[str] | None) -> None:
    model, tokenizer = load_model(model_name)
    builder = PromptBuilder.for_model(model, tokenizer, get_task(task_name))
    first = [ids[0] for ids in builder.label_ids()]
    if len(set(first)) != len(first):
        raise SystemExit(f"oracle: the labels of {task_name!r} share their first token")
    label_embeds = model.get_input_embeddings().weight[first].detach().clone()
    del model

    plain = SSMCompressor.states

    def states(self: SSMCompressor, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None = None):
        names = oracle_features(self, training)
        if names is None:
            return plain(self, inputs_embeds, attention_mask)
        B = inputs_embeds.shape[0]
        const = self.constant[None].expand(B, -1, -1).to(inputs_embeds.dtype)
        G, N = self.constant.shape
        proj = projection(len(names), G * N).to(inputs_embeds)
        f = label_features(inputs_embeds, attention_mask, label_embeds, names)
        return const + (f @ proj).view(B, G, N)

    SSMCompressor.states = states


def main() -> int:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    if sys.argv[1] == "targets":
        targets(*sys.argv[2:3])
        return 0
    training = None if sys.argv[1] in cli.SUBCOMMANDS else parse(sys.argv[1])
    argv = sys.argv[1:] if training is None else sys.argv[2:]
    if (argv[:1] == ["distill"]) != (training is not None):
        raise SystemExit("oracle: FEATURES go with distill, and only with it")

    def option(flag: str, default: str) -> str:
        return argv[argv.index(flag) + 1] if flag in argv else default

    install(option("--model", "smollm2-135m"), option("--task", "rotten_tomatoes"), training)
    rc = cli.main(argv)
    if rc == 0 and training is not None and "--out" in argv:
        (Path(option("--out", "")) / "ORACLE").write_text(",".join(training) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
