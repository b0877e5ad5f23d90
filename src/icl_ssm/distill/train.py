"""Two-stage distillation of an SSM compressor from a frozen teacher (the paper's Algorithm 1),
plus a ranking term aimed at what selection needs.

* Stage 1, KV alignment: ``mean over layers, heads, virtual tokens of
  (1 - cos(K~, Pool(K))) + (1 - cos(V~, Pool(V)))``, over the teacher's pooled K/V.
* Stage 2, output distillation: ``lambda_kl * T^2 KL(P_dense || P_compressed)`` at the answer
  position (temperature T, over the teacher's top-K tokens plus one bucket for the rest of
  the vocabulary), ``+ lambda_hidden * mean_l (1 - cos(psi_dense^l, psi_compressed^l))`` over
  every layer's hidden state at the answer position, ``+ lambda_rank * rank`` where ``rank``
  compares how the gold answer's loss *varies across the subsets of a group* on the same
  queries: ``mean_q mean_s ((L_c[s,q] - mean_s L_c[., q]) - (L_d[s,q] - mean_s L_d[., q]))^2``.
  The paper's objective has no such term; a compressor can have a small KL and still not
  rank subsets, and ranking is all selection uses.

Only the compressor trains. Training is data-parallel through ``accelerate`` (each process
takes whole groups and gradients are averaged across processes; the loss is a mean over the
step's groups, so N processes equal one process that takes all of them). Checkpoints are
written atomically (:mod:`.checkpoint`), and ``resume`` ends with the weights of an uninterrupted
run. The run's config and recipes are in :mod:`.config`.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from icl_ssm.compress.cache import compressed_cache, summary_inputs
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
from icl_ssm.distill.checkpoint import load_checkpoint, save_checkpoint, save_final
from icl_ssm.distill.config import COMPRESSOR_FIELDS, DistillConfig
from icl_ssm.distill.losses import bucket_kl, hidden_loss, kv_alignment_loss, label_kl, rank_loss
from icl_ssm.distill.teacher import TeacherCache
from icl_ssm.lm.batch import pad_ids
from icl_ssm.lm.prefix import forward_with_prefix


def _on(episode: dict, device: torch.device) -> dict:
    """An episode's target tensors (read from the teacher cache on the CPU) on ``device``; the
    token ids stay where they are until they are padded into a batch."""
    return {name: value.to(device) if isinstance(value, Tensor) and name != "prompt_ids" else value
            for name, value in episode.items()}


def group_losses(model, compressor: SSMCompressor, episodes: list[dict], cfg: DistillConfig, stage: int) -> dict:
    """Losses of one group of episodes (same queries), on the model's device. Returns scalar tensors."""
    device = model.device
    episodes = [_on(e, device) for e in episodes]
    if "prompt_values" in episodes[0]:  # a teacher that reads value tokens (the synthetic study's teacher)
        return regression_group_losses(model, compressor, episodes, cfg, stage)
    prompt_ids, prompt_mask = (t.to(device) for t in pad_ids([e["prompt_ids"] for e in episodes]))
    if stage == 1:
        with torch.no_grad():  # what the SSM reads at inference, over the same tokens
            embeds, summary_mask = summary_inputs(model, compressor, prompt_ids, prompt_mask)
        virtual = compressor(embeds, summary_mask)
        pool_k = torch.stack([e["pool_k"] for e in episodes])
        pool_v = torch.stack([e["pool_v"] for e in episodes])
        loss = kv_alignment_loss(virtual.keys, virtual.values, pool_k, pool_v)
        return {"loss": loss, "kv": loss.detach()}
    S, Q = len(episodes), len(episodes[0]["query_ids"])
    prefix = compressed_cache(model, compressor, prompt_ids, prompt_mask).repeat_interleave(Q)
    queries = [q for e in episodes for q in e["query_ids"]]
    q_ids, q_mask = (t.to(device) for t in pad_ids(queries, side="left"))
    out = forward_with_prefix(model, prefix, q_ids, q_mask, output_hidden_states=True, logits_to_keep=1)
    logp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)  # (S*Q, V)
    hidden = torch.stack([h[:, -1] for h in out.hidden_states[1:]], dim=1)  # (S*Q, m, H)
    cat = {name: torch.cat([e[name] for e in episodes]) for name in ("top_idx", "top_logp", "gold_token", "gold_logp")}
    cat["hidden"] = torch.cat([e["hidden"] for e in episodes])
    kl = bucket_kl(logp, cat["top_idx"], cat["top_logp"], cfg.temperature).mean()
    hid = hidden_loss(hidden, cat["hidden"]).mean()
    student_nll = -logp.gather(1, cat["gold_token"][:, None].long())[:, 0].view(S, Q)
    teacher_nll = -cat["gold_logp"].view(S, Q)
    rank = rank_loss(student_nll, teacher_nll, cfg.rank_level) if S > 1 else logp.new_zeros(())
    loss = cfg.lambda_kl * kl + cfg.lambda_hidden * hid + cfg.lambda_rank * rank
    out = {"kl": kl.detach(), "hidden": hid.detach(), "rank": rank.detach()}
    if cfg.lambda_label and episodes[0]["label_logp"].shape[-1]:
        tokens = torch.cat([e["label_tokens"].expand(Q, -1) for e in episodes])  # (S*Q, L)
        lab = label_kl(logp, tokens.long(), torch.cat([e["label_logp"] for e in episodes])).mean()
        loss = loss + cfg.lambda_label * lab
        out["label"] = lab.detach()
    return {"loss": loss, **out}


def regression_group_losses(model, compressor: SSMCompressor, episodes: list[dict], cfg: DistillConfig,
                            stage: int) -> dict:
    """:func:`group_losses` for a regression teacher: stage 1 the same KV alignment; stage 2 the
    squared error between the predictions after the compressed cache and after the dense prompt
    (``lambda_kl``, the KL's place), the hidden-state loss, and the ranking term on the subsets'
    squared errors against the true targets."""
    values = torch.stack([e["prompt_values"] for e in episodes])  # (S, 2k, F): one k per group
    mask = torch.ones(values.shape[:2], dtype=torch.bool, device=values.device)
    if stage == 1:
        with torch.no_grad():
            embeds, summary_mask = summary_inputs(model, compressor, values, mask)
        virtual = compressor(embeds, summary_mask)
        loss = kv_alignment_loss(virtual.keys, virtual.values, torch.stack([e["pool_k"] for e in episodes]),
                                 torch.stack([e["pool_v"] for e in episodes]))
        return {"loss": loss, "kv": loss.detach()}
    S, Q = len(episodes), episodes[0]["query_values"].shape[0]
    prefix = compressed_cache(model, compressor, values, mask).repeat_interleave(Q)
    queries = torch.cat([e["query_values"] for e in episodes])  # (S*Q, 1, F)
    out = forward_with_prefix(model, prefix, queries, output_hidden_states=True)
    pred = out.predictions[:, -1].float()
    hidden = torch.stack([h[:, -1] for h in out.hidden_states[1:]], dim=1)
    teacher = torch.cat([e["prediction"] for e in episodes])
    target = torch.cat([e["target"] for e in episodes])
    mse = ((pred - teacher) ** 2).mean()
    hid = hidden_loss(hidden, torch.cat([e["hidden"] for e in episodes])).mean()
    student_se, teacher_se = ((pred - target) ** 2).view(S, Q), ((teacher - target) ** 2).view(S, Q)
    rank = rank_loss(student_se, teacher_se, cfg.rank_level) if S > 1 else pred.new_zeros(())
    loss = cfg.lambda_kl * mse + cfg.lambda_hidden * hid + cfg.lambda_rank * rank
    return {"loss": loss, "mse": mse.detach(), "hidden": hid.detach(), "rank": rank.detach()}


def start_from(compressor: SSMCompressor, path: str, teacher_config) -> None:
    """Copy the weights of the compressor saved in ``path`` into ``compressor``; refuse one of
    another shape (every differing field named)."""
    from icl_ssm.compress.compressor import load_compressor

    source = load_compressor(path, teacher_config)
    mine, theirs = compressor.config, source.config
    diffs = [f"{name}: {getattr(theirs, name)!r} there, {getattr(mine, name)!r} here" for name in COMPRESSOR_FIELDS
             if getattr(theirs, name) != getattr(mine, name)]
    if diffs:
        raise ValueError(f"--init-from {path!r} is a compressor of another shape (" + "; ".join(diffs) + ")")
    compressor.load_state_dict(source.state_dict())


class TrainingDiverged(RuntimeError):
    pass


@dataclass
class Schedule:
    """Deterministic order of groups: stage, epoch and position are functions of the step."""

    groups: list[list[int]]  # episode indices per group
    cfg: DistillConfig
    steps: list[tuple[int, list[int]]] = field(default_factory=list)  # (stage, group ids)

    def __post_init__(self):
        rng_seed = self.cfg.seed
        stage1 = 0.0 if self.cfg.init_from else self.cfg.stage1_epochs  # a transferred compressor: stage 2 only
        for stage, epochs in ((1, stage1), (2, self.cfg.stage2_epochs)):
            n = int(round(epochs * len(self.groups)))
            order: list[int] = []
            epoch = 0
            while len(order) < n:
                perm = np.random.default_rng([rng_seed, stage, epoch]).permutation(len(self.groups))
                order.extend(perm.tolist())
                epoch += 1
            order = order[:n]
            g = self.cfg.groups_per_step
            for i in range(0, len(order) - g + 1, g):
                self.steps.append((stage, order[i : i + g]))

    def stage_bounds(self, stage: int) -> tuple[int, int]:
        idx = [i for i, (s, _) in enumerate(self.steps) if s == stage]
        return (idx[0], idx[-1] + 1) if idx else (0, 0)


def _lr_factor(step: int, start: int, end: int, warmup_ratio: float) -> float:
    """Linear warmup then cosine decay to 0 within [start, end)."""
    n = max(end - start, 1)
    t = step - start
    warm = max(1, int(warmup_ratio * n))
    if t < warm:
        return (t + 1) / warm
    return 0.5 * (1 + math.cos(math.pi * (t - warm) / max(n - warm, 1)))


def _average_gradients(module: torch.nn.Module, world: int) -> None:
    """All-reduce the gradients to their mean across processes, in one flat buffer.

    Every process starts from the same seeded weights and applies the same averaged update,
    so the replicas stay identical without a DDP wrapper (which would hide the compressor's
    config and trip over the control's unused parameters). A parameter that no process gave a
    gradient keeps ``grad = None``, as in one process: AdamW then skips it (a zero gradient
    would still count an Adam step and apply weight decay, e.g. to the gates during stage 1)."""
    if world == 1:
        return
    import torch.distributed as dist

    params = list(module.parameters())
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
    dist.all_reduce(has, op=dist.ReduceOp.MAX)
    params = [p for p, h in zip(params, has.tolist()) if h]
    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.flatten() for p in params])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p))
        offset += n


@torch.no_grad()
def training_states(model, compressor: SSMCompressor, teacher: TeacherCache, batch: int = 8) -> Tensor:
    """The untrained SSM's final states ``(n, G, N)`` on every training prompt (in episode order,
    so every process of a data-parallel run gets the same)."""
    out = []
    for lo in range(0, len(teacher.episodes), batch):
        ids, mask = pad_ids([teacher.get(i)["prompt_ids"] for i in range(lo, min(lo + batch, len(teacher.episodes)))])
        embeds, summary = summary_inputs(model, compressor, ids.to(model.device), mask.to(model.device))
        out.append(compressor.states(embeds.to(compressor.dtype), summary).float().cpu())
    return torch.cat(out)


def _new_compressor(model, cfg: DistillConfig, resume: bool, device: torch.device) -> SSMCompressor:
    """A compressor for ``model`` initialised from ``cfg.seed`` (the global torch RNG is left as it
    was), with the weights of ``cfg.init_from`` unless resuming, in training mode on ``device``."""
    info_params = sum(p.numel() for p in model.parameters())
    ccfg = SSMCompressorConfig.for_teacher(model.config, name=cfg.model, num_parameters=info_params,
                                           **cfg.compressor_overrides())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        compressor = SSMCompressor(ccfg).train()
    if cfg.init_from and not resume:
        start_from(compressor, cfg.init_from, model.config)
    # on the device before the optimizer exists: a resumed optimizer state follows its parameters there
    return compressor.to(device)


def _optimizer(compressor: SSMCompressor, cfg: DistillConfig) -> torch.optim.AdamW:
    """AdamW over the compressor; the gates and the learned steps at their own learning rates
    (``own_lr``, no weight decay), every other parameter at the stage's."""
    own = {"gate_bias": cfg.gate_lr, "ssm.log_dt": cfg.dt_lr}  # parameters with their own learning rate
    rest = [p for n, p in compressor.named_parameters() if n not in own]
    param_groups = [{"params": rest}] + [{"params": [p], "own_lr": own[n], "weight_decay": 0.0}
                                         for n, p in compressor.named_parameters() if n in own]
    return torch.optim.AdamW(param_groups, lr=cfg.stage1_lr, weight_decay=cfg.weight_decay)


def _schedule(teacher: TeacherCache, cfg: DistillConfig) -> Schedule:
    """The :class:`Schedule` of ``teacher``'s groups (in group order), or a ValueError when it has no step."""
    groups: dict[int, list[int]] = {}
    for i, e in enumerate(teacher.episodes):
        groups.setdefault(e.group, []).append(i)
    schedule = Schedule([groups[g] for g in sorted(groups)], cfg)
    if len(schedule.steps) == 0:
        raise ValueError(f"no training steps: {len(groups)} groups with groups_per_step={cfg.groups_per_step}")
    return schedule


def _set_lr(optimizer: torch.optim.Optimizer, schedule: Schedule, cfg: DistillConfig, step: int, stage: int) -> None:
    """Every parameter group's learning rate at ``step``: its own (or the stage's) times the warmup-cosine factor."""
    lo, hi = schedule.stage_bounds(stage)
    base = cfg.stage1_lr if stage == 1 else cfg.stage2_lr
    for pg in optimizer.param_groups:
        pg["lr"] = pg.get("own_lr", base) * _lr_factor(step, lo, hi, cfg.warmup_ratio)


def _step_loss(model, compressor: SSMCompressor, teacher: TeacherCache, groups: list[list[int]],
               cfg: DistillConfig, stage: int) -> tuple[Tensor, dict[str, float]]:
    """The mean of :func:`group_losses`' ``loss`` over ``groups`` (episode indices per group: this
    process's share of the step) and of every logged term, as floats."""
    total = None
    logs: dict[str, float] = {}
    for episode_ids in groups:
        episodes = [teacher.get(i) for i in episode_ids]
        losses = group_losses(model, compressor, episodes, cfg, stage)
        part = losses["loss"] / len(groups)
        total = part if total is None else total + part
        for key, value in losses.items():
            logs[key] = logs.get(key, 0.0) + float(value.detach()) / len(groups)
    return total, logs


def _check_finite(total: Tensor, step: int, stage: int, out: Path) -> None:
    """Raise :class:`TrainingDiverged` when the step's loss is nan or inf (before any update)."""
    if not torch.isfinite(total):
        raise TrainingDiverged(
            f"loss became {total.item()} at step {step} (stage {stage}); the last good checkpoint is kept "
            f"in {str(out / 'checkpoint')!r}"
        )


def _update(compressor: SSMCompressor, optimizer: torch.optim.Optimizer, total: Tensor, max_grad_norm: float,
            world: int) -> None:
    """One optimizer step on ``total``: gradients averaged over the processes, then clipped."""
    optimizer.zero_grad(set_to_none=True)
    total.backward()
    _average_gradients(compressor, world)
    torch.nn.utils.clip_grad_norm_(compressor.parameters(), max_grad_norm)
    optimizer.step()


def _mean_over_processes(logs: dict[str, float], world: int) -> dict[str, float]:
    """The step's logged terms over all processes, as one process would log them."""
    if world == 1:
        return logs
    import torch.distributed as dist

    names = sorted(logs)
    values = torch.tensor([logs[n] for n in names], dtype=torch.float64)
    dist.all_reduce(values)
    return {n: v / world for n, v in zip(names, values.tolist())}


def _watched(compressor: SSMCompressor) -> dict:
    """What the log follows of the compressor's own parameters: how far a gated compressor's
    virtual tokens have been let in, and the learned steps (one per group)."""
    record = {}
    if compressor.config.gate:
        gate = compressor.gate_bias
        record["gate_mean"], record["gate_max"] = gate.mean().item(), gate.max().item()
    if compressor.config.learn_dt:
        record["dt"] = compressor.ssm.log_dt.exp().tolist()
    return record


def train(
    model,
    teacher: TeacherCache,
    cfg: DistillConfig,
    out: Path,
    resume: bool = False,
    accelerator=None,
    progress: Callable[[dict], None] | None = None,
    stop_after: int | None = None,
) -> SSMCompressor:
    """Train a compressor on ``teacher``'s cached targets; write it to ``out``.

    ``stop_after`` ends the loop after that many steps without finishing (tests simulate an
    interruption with it). Raises :class:`TrainingDiverged` on a nan/inf loss, leaving the
    last good checkpoint in place.
    """
    from accelerate import Accelerator

    accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
    out = Path(out)
    compressor = _new_compressor(model, cfg, resume, accelerator.device)
    optimizer = _optimizer(compressor, cfg)
    schedule = _schedule(teacher, cfg)
    start_step, history = 0, []
    if resume:
        start_step, history = load_checkpoint(out, compressor, optimizer)
    elif compressor.config.standardize and not compressor.config.control:
        compressor.fit_standardizer(training_states(model, compressor, teacher))
    rank, world = accelerator.process_index, accelerator.num_processes
    if cfg.groups_per_step % world:
        raise ValueError(f"groups_per_step={cfg.groups_per_step} must be a multiple of the {world} processes")
    t0 = time.perf_counter()
    for step in range(start_step, len(schedule.steps)):
        if stop_after is not None and step - start_step >= stop_after:
            break
        stage, group_ids = schedule.steps[step]
        _set_lr(optimizer, schedule, cfg, step, stage)
        mine = [schedule.groups[gid] for gid in group_ids[rank::world]]
        total, logs = _step_loss(model, compressor, teacher, mine, cfg, stage)
        _check_finite(total, step, stage, out)
        _update(compressor, optimizer, total, cfg.max_grad_norm, world)
        logs = _mean_over_processes(logs, world)
        record = {"step": step, "stage": stage, "lr": optimizer.param_groups[0]["lr"], **logs,
                  "seconds": time.perf_counter() - t0, **_watched(compressor)}
        history.append(record)
        if progress and accelerator.is_main_process:
            progress({**record, "total_steps": len(schedule.steps), "start_step": start_step})
        if (step + 1) % cfg.checkpoint_every == 0 and accelerator.is_main_process:
            save_checkpoint(out, compressor, optimizer, step + 1, history)
        accelerator.wait_for_everyone()
    else:
        if accelerator.is_main_process:
            save_final(out, compressor, cfg, history)
            if (out / "checkpoint").exists():
                shutil.rmtree(out / "checkpoint")
    return compressor.eval()
