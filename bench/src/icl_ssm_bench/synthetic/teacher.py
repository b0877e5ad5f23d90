"""The teacher of the synthetic regression study: a small transformer that regresses in context.

Garg et al. (2022), "What can transformers learn in-context?" (https://arxiv.org/abs/2208.01066):
a causal transformer reads a prompt ``x_1, y_1, ..., x_k, y_k, x_q`` and predicts ``y`` at
every ``x`` token. Here the backbone is transformers' ``LlamaModel`` (RoPE, the standard
``DynamicCache``) fed through a linear read-in, and a linear read-out gives one number per
token. Tokens live in ``R^(d+1)``: an ``x`` token is ``[x, 0]``, a ``y`` token ``[0, ..., 0, y]``
(:func:`prompt_values`), so the two kinds are told apart by their last coordinate.

The model is a ``PreTrainedModel`` with a KV cache, so the project's cache code serves it as it
serves a language model: prefill the demonstrations once, then append query ``x`` tokens
through the cache. ``get_input_embeddings()`` is the read-in, which is what an SSM that scans
token embeddings reads (``read_in(values)``).

Also here: the reference predictors (least squares, ridge, zero) that the teacher is measured
against, :func:`evaluate_teacher` (squared error against the number of demonstrations), and
:func:`train_teacher` / :func:`load_teacher`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaModel, PreTrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.utils import ModelOutput

from icl_ssm.lm.hf import output_cache, with_cache
from icl_ssm_bench.synthetic.task import RegressionTask

# the fields that fix a teacher's weights' shapes (and the prompts it is trained on)
SHAPE_FIELDS = ("n_dims", "max_pairs", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim")


@strict
class RegressionTeacherConfig(PreTrainedConfig):
    """Shape of a regression teacher.

    ``n_dims``: input dimension ``d`` (tokens have ``d + 1`` coordinates); ``max_pairs``: the
    most demonstrations before a query that training shows (prompts of ``max_pairs + 1``
    pairs, ``2 * max_pairs + 2`` tokens); the rest is the Llama backbone's shape.
    """

    model_type = "icl_ssm_regression_teacher"

    n_dims: int = 20
    max_pairs: int = 40
    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        super().__post_init__(**kwargs)
        for name in SHAPE_FIELDS:
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")

    @property
    def token_size(self) -> int:
        """Coordinates of a token: ``n_dims + 1``."""
        return self.n_dims + 1

    def backbone_config(self) -> LlamaConfig:
        """The ``LlamaConfig`` of the backbone (no vocabulary: it only ever reads ``inputs_embeds``)."""
        return LlamaConfig(
            vocab_size=1,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            max_position_embeddings=2 * self.max_pairs + 2,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            rms_norm_eps=self.rms_norm_eps,
            initializer_range=self.initializer_range,
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=None,
            tie_word_embeddings=False,
        )


@dataclass
class RegressionOutput(ModelOutput):
    """``predictions: (B, T)``, the read-out at every token (meaningful at ``x`` tokens: the
    prediction of their ``y``); ``cache``: the KV cache when ``use_cache``; ``hidden_states`` /
    ``attentions`` as transformers returns them when asked."""

    predictions: Tensor | None = None
    cache: Cache | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


class RegressionTeacher(PreTrainedModel):
    """Tokens ``values: (B, T, d + 1)`` -> predictions ``(B, T)``, through read-in, Llama, read-out."""

    config_class = RegressionTeacherConfig
    base_model_prefix = "teacher"
    main_input_name = "values"
    _supports_sdpa = True

    def __init__(self, config: RegressionTeacherConfig):
        super().__init__(config)
        self.read_in = nn.Linear(config.token_size, config.hidden_size)
        self.backbone = LlamaModel(config.backbone_config())
        self.read_out = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def get_input_embeddings(self) -> nn.Linear:
        """The read-in ``Linear(d + 1 -> hidden)``: ``read_in(values)`` are the token embeddings."""
        return self.read_in

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.read_in = value

    def forward(
        self,
        values: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> RegressionOutput:
        """Exactly one of ``values: (B, T, d + 1)`` (raw tokens) and ``inputs_embeds: (B, T, hidden)``
        (``read_in(values)``). ``attention_mask``: ``(B, L + T)`` over the cached and new tokens, or
        a 4D additive mask, as a causal LM takes it; ``position_ids: (B, T)``; ``cache`` (alias
        ``past_key_values``): a cache holding the ``L`` tokens before these, extended in place."""
        if (values is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of values (B, T, d + 1) and inputs_embeds (B, T, hidden)")
        if values is not None:
            if values.ndim != 3 or values.shape[-1] != self.config.token_size:
                raise ValueError(f"values must be (batch, T, {self.config.token_size}) tokens [x, 0] / [0, y], "
                                 f"got shape {tuple(values.shape)}")
            inputs_embeds = self.read_in(values.to(self.read_in.weight.dtype))
        if cache is None:
            cache = past_key_values
        out = self.backbone(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=use_cache, **with_cache(self.backbone, cache), **kwargs)
        predictions = self.read_out(out.last_hidden_state).squeeze(-1)  # (B, T)
        return RegressionOutput(
            predictions=predictions,
            cache=output_cache(out) if use_cache else None,
            hidden_states=out.get("hidden_states"),
            attentions=out.get("attentions"),
        )


# ---------------------------------------------------------------------------------------
# prompts
# ---------------------------------------------------------------------------------------


def prompt_values(xs: Tensor | np.ndarray, ys: Tensor | np.ndarray | None = None) -> Tensor:
    """Tokens of prompts: ``xs: (B, P, d)``, ``ys: (B, P)`` -> ``(B, 2P, d + 1)``, interleaved
    ``[x_1, 0], [0, y_1], ..., [x_P, 0], [0, y_P]``. Without ``ys``: the ``x`` tokens alone,
    ``(B, P, d + 1)`` (queries)."""
    xs = torch.as_tensor(xs, dtype=torch.float32)
    if xs.ndim != 3:
        raise ValueError(f"xs must be (batch, pairs, d), got shape {tuple(xs.shape)}")
    B, P, d = xs.shape
    x_tok = torch.cat([xs, xs.new_zeros(B, P, 1)], dim=-1)  # (B, P, d + 1)
    if ys is None:
        return x_tok
    ys = torch.as_tensor(ys, dtype=torch.float32)
    if ys.shape != (B, P):
        raise ValueError(f"ys must be (batch, pairs) = {(B, P)} to match xs, got {tuple(ys.shape)}")
    y_tok = torch.cat([xs.new_zeros(B, P, d), ys[..., None]], dim=-1)  # (B, P, d + 1)
    return torch.stack([x_tok, y_tok], dim=2).reshape(B, 2 * P, d + 1)


@torch.no_grad()
def teacher_predictions(model: RegressionTeacher, xs, ys, batch_size: int = 256) -> np.ndarray:
    """Teacher-forced predictions at every ``x``: ``xs: (B, P, d)``, ``ys: (B, P)`` -> ``(B, P)``
    float64, column ``i`` from the ``i`` pairs before it (Garg's evaluation)."""
    device = model.read_in.weight.device
    values = prompt_values(xs, ys)
    out = []
    for i in range(0, values.shape[0], batch_size):
        pred = model(values=values[i: i + batch_size].to(device)).predictions  # (b, 2P)
        out.append(pred[:, 0::2].double().cpu())
    return torch.cat(out).numpy()


# ---------------------------------------------------------------------------------------
# reference predictors: (B, P, d), (B, P) -> (B, P), column i fitted on pairs < i
# ---------------------------------------------------------------------------------------


def least_squares_predictions(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Minimum-norm least squares on the pairs before each ``x`` (Garg's baseline; 0 with none)."""
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    B, P, _ = xs.shape
    out = np.zeros((B, P))
    for i in range(1, P):
        beta = np.linalg.pinv(xs[:, :i]) @ ys[:, :i, None]  # (B, d, 1)
        out[:, i] = (xs[:, i, None] @ beta)[:, 0, 0]
    return out


def ridge_predictions(xs: np.ndarray, ys: np.ndarray, lam: float) -> np.ndarray:
    """Ridge ``argmin |X b - y|^2 + lam |b|^2`` on the pairs before each ``x``. With
    ``lam = sigma^2 * d`` it is the posterior mean, Bayes-optimal, for ``beta ~ N(0, I / d)``."""
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    B, P, d = xs.shape
    out = np.zeros((B, P))
    for i in range(1, P):
        X, y = xs[:, :i], ys[:, :i, None]
        gram = X.transpose(0, 2, 1) @ X + lam * np.eye(d)  # (B, d, d)
        beta = np.linalg.solve(gram, X.transpose(0, 2, 1) @ y)
        out[:, i] = (xs[:, i, None] @ beta)[:, 0, 0]
    return out


# ---------------------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate_teacher(
    model: RegressionTeacher,
    task: RegressionTask,
    rng: np.random.Generator,
    *,
    n_prompts: int = 1000,
    mixed_ks: tuple[int, ...] = (10, 20, 40),
    d1_shares: tuple[float, ...] = (1.0, 0.75, 0.5, 0.25, 0.0),
) -> dict:
    """Squared error of the teacher against its references.

    ``"by_k"``: prompts of ``max_pairs + 1`` pairs, each from one fresh random function (the
    training distribution); rows ``{"k", "teacher", "least_squares", "ridge", "zero"}``, the mean
    squared error of predicting pair ``k + 1`` from the ``k`` before it, ``k = 0..max_pairs``,
    each with its standard error over the prompts (``"teacher_se"``, ...).
    ``ridge`` uses ``lam = sigma^2 * d`` (Bayes-optimal for ``"linear"``).

    ``"mixed"``: prompts on the task's fixed clusters: ``k`` demonstrations of which
    ``round(share * k)`` come from the query's cluster (D1) and the rest from other clusters (D2),
    then one D1 query; rows ``{"k", "d1_share", "teacher", "least_squares", "ridge"}``.
    """
    model.eval()
    P = model.config.max_pairs + 1
    lam = task.sigma**2 * task.d
    xs, ys = task.sample_prompts(rng, n_prompts, P)
    preds = {
        "teacher": teacher_predictions(model, xs, ys),
        "least_squares": least_squares_predictions(xs, ys),
        "ridge": ridge_predictions(xs, ys, lam),
        "zero": np.zeros(ys.shape),
    }
    sq = {name: (p - ys) ** 2 for name, p in preds.items()}  # (n_prompts, P)
    by_k = [{"k": k, **{name: float(e[:, k].mean()) for name, e in sq.items()},
             **{f"{name}_se": float(e[:, k].std(ddof=1) / np.sqrt(len(e))) for name, e in sq.items()}}
            for k in range(P)]

    mixed = []
    for k in mixed_ks:
        if k > model.config.max_pairs:
            raise ValueError(f"mixed_ks holds {k}, more demonstrations than max_pairs={model.config.max_pairs}")
        for share in d1_shares:
            xs, ys = mixed_prompts(task, rng, n_prompts, k, share)
            row = {"k": k, "d1_share": share}
            row["teacher"] = float(((teacher_predictions(model, xs, ys)[:, -1] - ys[:, -1]) ** 2).mean())
            row["least_squares"] = float(((_last(least_squares_predictions, xs, ys) - ys[:, -1]) ** 2).mean())
            row["ridge"] = float(((_last(ridge_predictions, xs, ys, lam) - ys[:, -1]) ** 2).mean())
            mixed.append(row)
    return {"by_k": by_k, "mixed": mixed}


def mixed_prompts(task: RegressionTask, rng: np.random.Generator, n: int, k: int, d1_share: float):
    """``n`` prompts of ``k`` demonstrations on the task's clusters, ``round(d1_share * k)`` from
    the query's (random) cluster at random places and the rest from other clusters, then one
    query from the query's cluster: ``xs: (n, k + 1, d)``, ``ys: (n, k + 1)``."""
    xs = np.empty((n, k + 1, task.d), np.float32)
    ys = np.empty((n, k + 1), np.float32)
    for i in range(n):
        query = int(rng.integers(task.clusters))
        split = task.sample_selection(rng, k, d1_share, n_valid=0, n_test=1, query_cluster=query)
        xs[i, :k], ys[i, :k] = split.pool_x, split.pool_y
        xs[i, k], ys[i, k] = split.test_x[0], split.test_y[0]
    return xs, ys


def _last(predict: Callable, xs: np.ndarray, ys: np.ndarray, *args) -> np.ndarray:
    return predict(xs, ys, *args)[:, -1]


# ---------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------


def curriculum(step: int, steps: int, d: int, max_points: int, *, start_dims: int = 5, start_points: int = 11,
               ramp: float = 0.5) -> tuple[int, int]:
    """Garg's curriculum, compressed into ``steps``: ``(dims, points)`` at ``step``. Stage ``s``
    has ``start_dims + s`` active dimensions and ``start_points + 2 s`` pairs per prompt (both
    capped); the stages are equally long and the last (full size) starts at ``ramp * steps``."""
    start_dims, start_points = min(start_dims, d), min(start_points, max_points)
    stages = max(d - start_dims, math.ceil((max_points - start_points) / 2))
    if stages == 0:
        return d, max_points
    stage = min(stages, step * stages // max(1, int(ramp * steps)))
    return min(d, start_dims + stage), min(max_points, start_points + 2 * stage)


def prompt_loss(model: RegressionTeacher, xs: Tensor, ys: Tensor) -> Tensor:
    """Mean squared error of the predictions at every ``x`` token: ``xs: (B, P, d)``, ``ys: (B, P)``."""
    pred = model(values=prompt_values(xs, ys)).predictions[:, 0::2]  # (B, P)
    return ((pred - ys) ** 2).mean()


def train_teacher(
    config: RegressionTeacherConfig,
    task: RegressionTask,
    out: str | Path,
    *,
    steps: int,
    batch: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    use_curriculum: bool = True,
    ramp: float = 0.5,
    warmup: int = 200,
    weight_decay: float = 0.0,
    log_every: int = 100,
    log: Callable[[str], None] | None = None,
    init_from: str | Path | None = None,
) -> Path:
    """Train a teacher on Garg's prompts (each from one fresh function) and save it.

    From scratch, or, with ``init_from``, from the weights of a teacher saved by this function
    (its shape must equal ``config``'s, or a ValueError names the fields that differ): a teacher
    that already regresses in context, carried to another function class.

    AdamW at ``lr`` with ``warmup`` linear steps then cosine decay to ``lr / 10``; gradients
    clipped at norm 1. ``use_curriculum``: :func:`curriculum` over dims and pairs, full size
    from ``ramp * steps`` on. Writes ``out/`` (``config.json``, ``model.safetensors`` and ``training.json``
    with the task, the recipe, the loss curve and the wall time) atomically: everything goes to a
    temporary directory beside ``out``, renamed into place at the end. Returns ``out``.
    """
    if config.n_dims != task.d:
        raise ValueError(f"config.n_dims={config.n_dims} differs from task.d={task.d}; they must match")
    if steps < 1 or batch < 1:
        raise ValueError(f"steps and batch must be >= 1, got steps={steps}, batch={batch}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 1])
    if init_from is not None:
        model = load_teacher(init_from)
        differ = [name for name in SHAPE_FIELDS if getattr(model.config, name) != getattr(config, name)]
        if differ:
            raise ValueError(f"init_from teacher {str(init_from)!r} differs from config in "
                             + ", ".join(f"{n} ({getattr(model.config, n)} vs {getattr(config, n)})" for n in differ))
    else:
        with torch.random.fork_rng(devices=[]):  # seeded initialisation, global RNG untouched
            torch.manual_seed(seed)
            model = RegressionTeacher(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    max_points = config.max_pairs + 1
    history = []
    start = time.perf_counter()
    running = []
    for step in range(steps):
        full = (task.d, max_points)
        dims, points = curriculum(step, steps, *full, ramp=ramp) if use_curriculum else full
        xs, ys = task.sample_prompts(rng, batch, points, dims)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = prompt_loss(model, torch.from_numpy(xs), torch.from_numpy(ys))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            row = {"step": step + 1, "loss": float(np.mean(running)), "dims": dims, "points": points,
                   "lr": lr_at(step), "seconds": round(time.perf_counter() - start, 1)}
            history.append(row)
            running = []
            if log is not None:
                log(json.dumps(row))
    wall = time.perf_counter() - start
    record = {
        "task": asdict(task),
        "recipe": {"steps": steps, "batch": batch, "lr": lr, "seed": seed, "use_curriculum": use_curriculum,
                   "ramp": ramp, "warmup": warmup, "weight_decay": weight_decay,
                   "torch_threads": torch.get_num_threads(),
                   "init_from": None if init_from is None else str(init_from)},
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "wall_seconds": round(wall, 1),
        "final_loss": history[-1]["loss"],
        "history": history,
    }
    _save_atomic(model.eval(), out, {"training.json": record})
    return out


def _save_atomic(model: PreTrainedModel, out: Path, extra_json: dict[str, dict]) -> None:
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    old = None
    try:
        model.save_pretrained(tmp)
        for name, obj in extra_json.items():
            (tmp / name).write_text(json.dumps(obj, indent=1) + "\n")
        # the modes a plain mkdir / open() would give (mkdtemp and safetensors make owner-only ones)
        os.chmod(tmp, 0o777 & ~_umask())
        for file in tmp.iterdir():
            os.chmod(file, 0o666 & ~_umask())
        if out.exists():  # directories cannot be replaced in one rename: move the old one aside first
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
            os.replace(out, old / out.name)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            os.replace(old / out.name, out)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def load_teacher(path: str | Path) -> RegressionTeacher:
    """Load a teacher saved by :func:`train_teacher` (eval mode); refuse a directory without one."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"teacher directory {str(path)!r} does not exist")
    for name in ("config.json", "model.safetensors"):
        if not (path / name).is_file():
            raise ValueError(f"teacher directory {str(path)!r} has no {name}; expected the output of train_teacher")
    return RegressionTeacher.from_pretrained(str(path)).eval()


__all__ = [
    "SHAPE_FIELDS",
    "RegressionOutput",
    "RegressionTeacher",
    "RegressionTeacherConfig",
    "curriculum",
    "evaluate_teacher",
    "least_squares_predictions",
    "load_teacher",
    "mixed_prompts",
    "prompt_loss",
    "prompt_values",
    "ridge_predictions",
    "teacher_predictions",
    "train_teacher",
]
