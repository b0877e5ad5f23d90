"""The Legendre spectrum of a KV cache (the paper's figure 2 and Proposition 1): how much of the
keys' and values' energy along the prompt the first ``n`` Legendre coefficients hold.

A cache's keys of one head are a sequence ``x: (T, d)`` over positions; the positions are mapped
to ``[-1, 1]`` and ``x`` is projected on the Legendre polynomials of degree ``0 .. D-1``
sampled there. Sampled polynomials are not exactly orthogonal, so the fast path
(:func:`legendre_energy`) orthonormalises them by a QR of their Vandermonde matrix and reads the
energy captured by the first ``n`` as the squared norms of the leading coefficients; the
reference (:func:`legendre_energy_ref`) refits the first ``n`` polynomials by least squares for
every ``n``. A state of ``N`` LegS coefficients can at best keep the fraction captured at
``n = N``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from numpy.polynomial import legendre

from icl_ssm import atomic


def _grid(T: int) -> np.ndarray:
    return (2.0 * (np.arange(T) + 0.5) / T) - 1.0  # midpoints in [-1, 1]


def legendre_energy(x: np.ndarray | torch.Tensor, degrees: int) -> np.ndarray:
    """``(min(degrees, T),)``: the fraction of ``x``'s energy (``x: (T, d)``, squared norm over
    positions and channels) captured by its least-squares fit on the first ``n`` Legendre
    polynomials, ``n = 1, 2, ...``. Non-decreasing, at most 1."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"x must be (positions, channels), got shape {x.shape}")
    if degrees < 1:
        raise ValueError(f"degrees={degrees}; expected >= 1")
    D = min(degrees, x.shape[0])
    V = legendre.legvander(_grid(x.shape[0]), D - 1)  # (T, D)
    Q, _ = np.linalg.qr(V)  # the same nested spans as V's leading columns
    coef = Q.T @ x  # (D, d)
    total = float((x**2).sum())
    if total == 0.0:
        return np.ones(D)
    return np.cumsum((coef**2).sum(1)) / total


def legendre_energy_ref(x: np.ndarray | torch.Tensor, degrees: int) -> np.ndarray:
    """Reference for :func:`legendre_energy`: for every ``n``, a least-squares fit of ``x`` on the
    first ``n`` Legendre polynomials and the share of the energy it leaves out, subtracted from 1."""
    x = np.asarray(x, dtype=np.float64)
    D = min(degrees, x.shape[0])
    t = _grid(x.shape[0])
    total = float((x**2).sum())
    out = []
    for n in range(1, D + 1):
        V = legendre.legvander(t, n - 1)
        fit = V @ np.linalg.lstsq(V, x, rcond=None)[0]
        out.append(1.0 - float(((x - fit) ** 2).sum()) / total if total else 1.0)
    return np.array(out)


def cache_spectrum(keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], groups: Sequence[Sequence[int]],
                   degrees: int) -> dict[str, Any]:
    """Per layer group, the mean over its layers and KV heads of :func:`legendre_energy` of the
    keys and of the values of one prompt (``keys[l]: (H_kv, T, d)``, batch removed)."""
    out = []
    for g, layers in enumerate(groups):
        row = {"group": g, "layers": list(layers)}
        for name, tensors in (("keys", keys), ("values", values)):
            curves = [legendre_energy(tensors[l][h].float().cpu().numpy(), degrees)
                      for l in layers for h in range(tensors[l].shape[0])]
            row[name] = np.mean(curves, axis=0).tolist()
        out.append(row)
    return {"groups": out}


def run_spectrum(model_name: str, task_name: str, k: int, prompts: int, degrees: int, seed: int = 0,
                 num_groups: int = 4) -> dict[str, Any]:
    """The spectrum of the dense caches of ``prompts`` random ``k``-shot prompts of a task,
    averaged over the prompts."""
    from icl_ssm.compress.cache import dense_cache
    from icl_ssm.compress.compressor import SSMCompressorConfig
    from icl_ssm.data.splits import split
    from icl_ssm.data.tasks import get_task
    from icl_ssm.lm.models import load_model
    from icl_ssm.lm.prompts import PromptBuilder

    model, tokenizer = load_model(model_name)
    task = get_task(task_name)
    pool = split(task, seed=seed).pool
    builder = PromptBuilder.for_model(model, tokenizer, task)
    groups = SSMCompressorConfig.for_teacher(model.config, num_groups=num_groups).layer_groups()
    rng = np.random.default_rng(seed)
    runs, lengths = [], []
    for _ in range(prompts):
        demos = [pool[i] for i in rng.choice(len(pool), k, replace=False)]
        ids = torch.tensor([builder.build_prefix(demos).input_ids], device=model.device)
        with torch.no_grad():
            cache = dense_cache(model, ids)
        lengths.append(ids.shape[1])
        runs.append(cache_spectrum([t[0] for t in cache.keys], [t[0] for t in cache.values], groups, degrees))
    merged = []
    for g in range(len(groups)):
        at = [r["groups"][g] for r in runs]
        n = min(len(a["keys"]) for a in at)
        merged.append({"group": g, "layers": at[0]["layers"],
                       "keys": np.mean([a["keys"][:n] for a in at], axis=0).tolist(),
                       "values": np.mean([a["values"][:n] for a in at], axis=0).tolist()})
    return {"model": model_name, "task": task_name, "k": k, "prompts": prompts, "prompt_tokens": lengths,
            "degrees": degrees, "groups": merged}


def plot_spectrum(result: dict, path) -> None:
    """Energy captured against the number of Legendre coefficients, one line per layer group
    (keys solid, values dashed), as a PNG."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    for g in result["groups"]:
        n = np.arange(1, len(g["keys"]) + 1)
        line, = ax.plot(n, g["keys"], label=f"layers {g['layers'][0]}-{g['layers'][-1]} keys")
        ax.plot(n, g["values"], linestyle="--", color=line.get_color(), label="values")
    ax.set_xscale("log")
    ax.set_xlabel("Legendre coefficients kept")
    ax.set_ylabel("share of the energy captured")
    ax.set_title(f"{result['model']}, {result['task']}, k={result['k']} "
                 f"(~{int(np.mean(result['prompt_tokens']))} tokens)")
    ax.legend(fontsize=7, ncol=2)
    atomic.write_with(path, lambda f: fig.savefig(f, format="png"))
