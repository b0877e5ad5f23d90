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
written atomically, and ``resume`` ends with the weights of an uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from icl_ssm import atomic
from icl_ssm.compress.cache import compressed_cache, forward_with_prefix, summary_inputs
from icl_ssm.compress.compressor import SSMCompressor, SSMCompressorConfig
from icl_ssm.distill.losses import RANK_LEVELS, bucket_kl, hidden_loss, kv_alignment_loss, label_kl, rank_loss
from icl_ssm.distill.teacher import TeacherCache, validate_shared_tail
from icl_ssm.lm.batch import pad_ids
from icl_ssm.ssm.layer import validate_learn_dt

COMPRESSOR_FIELDS = ("state_size", "channels", "num_groups", "num_virtual", "num_sink", "num_recent", "latent_size",
                     "system", "dt", "learn_dt", "method", "control", "standardize", "position", "gate", "gate_init",
                     "ssm_input", "pair_size", "pair_window", "input_rank")


@dataclass
class DistillConfig:
    """One distillation run. Every weight of the objective is a field.

    :data:`FIELD_HELP` says what each field means. The defaults are the recipe measured best
    on SmolLM2-135M (BENCHMARKS.md: the gated hybrid, run G, with a 25% warm-up, and the
    scale-invariant LegS system, best of item 7's ablation over three tasks): 16 exact recent
    tokens beside gated virtual tokens, the ranking term, stage 2 at 1e-3 for 2 epochs.
    ``DistillConfig.recipe("paper")`` gives the paper's own settings for everything that recipe
    changes (:data:`PAPER_RECIPE`).
    """

    model: str = "smollm2-135m"
    tasks: tuple[str, ...] = ("rotten_tomatoes",)
    k: int = 20
    samples: int = 128
    queries: int = 8
    group_size: int = 4
    shared_tail: int = 0
    shared_tail_every: int = 1
    seed: int = 0
    # compressor
    state_size: int = 256
    channels: int = 1
    num_groups: int = 0
    num_virtual: int = 16
    num_sink: int = 4
    num_recent: int = 16
    latent_size: int = 128
    system: str = "scale_invariant"
    dt: float = 0.002  # time_invariant only
    learn_dt: bool = False
    dt_lr: float = 0.05
    method: str = "bilinear"
    control: bool = False
    standardize: bool = False
    position: str = "compressed"
    gate: bool = True
    gate_init: float = -4.0
    ssm_input: str = "embeddings"  # what the SSM scans: embeddings, or "layer:l" (the states after l layers)
    pair_size: int = 0  # > 0: the SSM also scans products of each token with those before it
    pair_window: int = 1
    input_rank: int = 0  # > 0: the SSM reads a learned rank-r projection of its input
    gate_lr: float = 0.1  # the gates' own learning rate (same schedule): a gate moves ~lr per step under Adam
    # stage 1 (the paper's code: lr 3e-4, 2 epochs)
    stage1_epochs: float = 2.0
    stage1_lr: float = 3e-4
    # stage 2 (the paper's code: lr 5e-5, 1 epoch, KL at temperature 2 scaled by T^2)
    stage2_epochs: float = 2.0
    stage2_lr: float = 1e-3
    temperature: float = 2.0
    lambda_kl: float = 1.0
    lambda_hidden: float = 1.0
    lambda_rank: float = 1.0
    rank_level: str = "query"
    lambda_label: float = 0.0
    topk: int = 64
    groups_per_step: int = 1
    warmup_ratio: float = 0.25  # of each stage's steps; 0.05 lets stage 2 at 1e-3 diverge on modular_addition
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    checkpoint_every: int = 50
    chat: bool = False
    task_options: dict[str, dict] = field(default_factory=dict)  # task name -> get_task options
    init_from: str = ""  # a trained compressor directory: start from its weights, stage 2 only (transfer)

    def __post_init__(self):
        self.tasks = tuple(self.tasks)
        for name in ("k", "samples", "queries", "group_size", "groups_per_step", "checkpoint_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("pair_size", "input_rank"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be an integer >= 0 (0: off), got {getattr(self, name)!r}")
        if not isinstance(self.pair_window, int) or self.pair_window <= 0:
            raise ValueError(f"pair_window must be a positive integer, got {self.pair_window!r}")
        for name in ("stage1_epochs", "stage2_epochs", "lambda_kl", "lambda_hidden", "lambda_rank",
                     "lambda_label", "gate_lr", "dt_lr"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        validate_shared_tail(self.shared_tail, self.shared_tail_every, self.k)
        if self.rank_level not in RANK_LEVELS:
            raise ValueError(f"rank_level {self.rank_level!r}; accepted: {', '.join(RANK_LEVELS)}")
        validate_learn_dt(self.learn_dt, self.system)
        if self.init_from and self.stage2_epochs == 0:
            raise ValueError(f"--init-from {self.init_from!r} runs stage 2 only, but --stage2-epochs is 0")
        if self.stage1_epochs == 0 and self.stage2_epochs == 0:
            raise ValueError("stage1_epochs and stage2_epochs are both 0: nothing to train")

    def compressor_overrides(self) -> dict:
        out = {name: getattr(self, name) for name in COMPRESSOR_FIELDS}
        if not out["num_groups"]:
            del out["num_groups"]
        return out

    @classmethod
    def recipe(cls, name: str = "measured", **overrides) -> DistillConfig:
        """The named recipe (:data:`RECIPES`) with ``overrides`` on top."""
        if name not in RECIPES:
            raise ValueError(f"recipe {name!r}: accepted: {', '.join(RECIPES)}")
        return cls(**{**RECIPES[name], **overrides})


# What each DistillConfig field means (the ``icl-ssm distill`` flags' help)
FIELD_HELP = {
    "model": "teacher: an embedded name, a Hugging Face id or a local directory",
    "tasks": "one or several tasks (training episodes are spread over them)",
    "k": "demonstrations per training subset",
    "samples": "training episodes (demonstration subsets), teacher targets cached on disk",
    "queries": "validation queries per episode, shared by the subsets of a group",
    "group_size": "subsets that share their queries (what the ranking term compares)",
    "shared_tail": "last demonstrations common to a group's subsets (0: independent subsets)",
    "shared_tail_every": "shared tails in every e-th group only (the others independent)",
    "seed": "training subsets, queries and initialisation",
    "state_size": "SSM state size N",
    "channels": "independent LegS memories per layer group, N / channels coefficients each (1: the paper's layout)",
    "num_groups": "layer groups, one SSM and head each (0: 4, capped at the layer count)",
    "num_virtual": "virtual tokens n_v per layer",
    "num_sink": "exact attention-sink tokens at the start of the prompt",
    "num_recent": "last prompt tokens kept exact, re-encoded after the summary",
    "latent_size": "width of the head's latent",
    "system": "SSM transition: time_invariant (LegS with step dt) or scale_invariant (LegS, no dt)",
    "dt": "SSM step (time_invariant): memory of about 1/dt tokens",
    "learn_dt": "make log dt a parameter per layer group, starting at log(dt), trained at dt_lr",
    "dt_lr": "learning rate of log dt (with --learn-dt; same schedule, no weight decay)",
    "method": "discretisation: bilinear or zoh",
    "control": "prompt-independent virtual tokens (the control a compressor is judged against)",
    "standardize": "centre and scale each SSM state coordinate by its mean and std over the training prompts",
    "position": "position ids after the cache: compressed (count cache slots) or original (prompt length)",
    "gate": "a learned attention bias per virtual token, starting at --gate-init (nearly closed)",
    "gate_init": "starting gate bias (very negative: the untrained cache is the sinks + recent window)",
    "ssm_input": "what the SSM scans: embeddings (the paper), or layer:l, the teacher's hidden states after its "
                 "first l layers (they can carry interactions of tokens; cost l/L of a dense prefill)",
    "pair_size": "products of each token with a learned filter of the tokens before it that the SSM scans beside "
                 "its input (H3's multiplicative input: lets the state sum token interactions; 0: none, the paper)",
    "pair_window": "how many tokens back those products reach (the filter's length)",
    "input_rank": "a learned projection of the SSM's input to this many numbers per token, shared by the layer "
                  "groups (0: none, the paper): a cheaper scan input",
    "gate_lr": "learning rate of the gates",
    "stage1_epochs": "stage 1 (KV alignment to the pooled teacher K/V) epochs",
    "init_from": "a compressor trained on another task (same teacher and shape): start from its weights and run "
                 "stage 2 only (cross-task transfer)",
    "stage1_lr": "stage 1 learning rate",
    "stage2_epochs": "stage 2 (output distillation) epochs",
    "stage2_lr": "stage 2 learning rate",
    "temperature": "KL temperature (the loss is scaled by its square)",
    "lambda_kl": "weight of the answer-distribution KL",
    "lambda_hidden": "weight of the query hidden-state cosine term",
    "lambda_rank": "weight of the ranking term (how losses differ between a group's subsets; not in the paper)",
    "rank_level": "what the ranking term matches: query (each subset-query loss) or subset (each subset's mean loss)",
    "lambda_label": "weight of the KL over the label words alone (classification, temperature 1)",
    "topk": "teacher answer tokens stored per query (the rest is one bucket)",
    "groups_per_step": "groups per optimiser step",
    "warmup_ratio": "warm-up share of each stage's steps",
    "weight_decay": "AdamW weight decay",
    "max_grad_norm": "gradient clipping norm",
    "checkpoint_every": "steps between checkpoints",
    "chat": "wrap prompts in the model's chat template",
}


# The paper's settings (from its code) for every field the measured recipe changes: no exact
# recent tokens, no gates, no ranking term, stage 2 at 5e-5 for one epoch, a 5% warm-up.
PAPER_RECIPE = {"num_recent": 0, "gate": False, "lambda_rank": 0.0, "stage2_lr": 5e-5, "stage2_epochs": 1.0,
                "warmup_ratio": 0.05, "system": "time_invariant"}


RECIPES: dict[str, dict] = {"measured": {}, "paper": PAPER_RECIPE}


def _on(episode: dict, device: torch.device) -> dict:
    """An episode's target tensors (read from the teacher cache on the CPU) on ``device``; the
    token ids stay where they are until they are padded into a batch."""
    return {name: value.to(device) if isinstance(value, Tensor) and name != "prompt_ids" else value
            for name, value in episode.items()}


def group_losses(model, compressor: SSMCompressor, episodes: list[dict], cfg: DistillConfig, stage: int) -> dict:
    """Losses of one group of episodes (same queries), on the model's device. Returns scalar tensors."""
    device = model.device
    episodes = [_on(e, device) for e in episodes]
    if "prompt_values" in episodes[0]:  # a teacher that reads value tokens (distill.regression)
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


def _atomic_dir_write(target: Path, write: Callable[[Path], None]) -> None:
    tmp = target.with_name(target.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    write(tmp)
    old = target.with_name(target.name + ".old")
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    if old.exists():
        shutil.rmtree(old)


def save_checkpoint(directory: Path, compressor, optimizer, step: int, history: list[dict]) -> None:
    def write(tmp: Path) -> None:
        compressor.save_pretrained(tmp)
        torch.save({"optimizer": optimizer.state_dict(), "step": step, "history": history,
                    "torch_rng": torch.get_rng_state()}, tmp / "trainer_state.pt")

    _atomic_dir_write(directory / "checkpoint", write)


def save_final(out: Path, compressor, cfg, history: list[dict]) -> None:
    """The trained weights, config and history, each file complete or absent.

    ``save_pretrained`` writes into a temporary directory beside them; its files get the mode a
    plain ``open()`` would give (safetensors writes owner-only files) and are renamed into
    ``out`` one by one, the weights last: weights present and no checkpoint left is what
    ``validate_out`` reads as a finished run.
    """
    tmp = out / ".final.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    compressor.save_pretrained(tmp)
    for f in sorted(tmp.iterdir(), key=lambda f: f.name == "model.safetensors"):
        atomic.move_in(f, out / f.name)
    tmp.rmdir()
    atomic.write_text(out / "distill_config.json", json.dumps(asdict(cfg), indent=1))
    atomic.write_text(out / "history.jsonl", "".join(json.dumps(h) + "\n" for h in history))


def load_checkpoint(directory: Path, compressor, optimizer) -> tuple[int, list[dict]]:
    ckpt = directory / "checkpoint"
    try:
        from safetensors.torch import load_file

        compressor.load_state_dict(load_file(str(ckpt / "model.safetensors")))
        trainer = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        optimizer.load_state_dict(trainer["optimizer"])
        torch.set_rng_state(trainer["torch_rng"])
    except FileNotFoundError as err:
        raise ValueError(f"--resume: no checkpoint in {str(directory)!r} ({err.filename} is missing)") from err
    except Exception as err:
        raise ValueError(f"--resume: checkpoint in {str(ckpt)!r} is corrupted: {type(err).__name__}: {err}") from err
    return trainer["step"], trainer["history"]


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
    info_params = sum(p.numel() for p in model.parameters())
    ccfg = SSMCompressorConfig.for_teacher(model.config, name=cfg.model, num_parameters=info_params,
                                           **cfg.compressor_overrides())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        compressor = SSMCompressor(ccfg).train()
    if cfg.init_from and not resume:
        start_from(compressor, cfg.init_from, model.config)
    # on the device before the optimizer exists: a resumed optimizer state follows its parameters there
    compressor.to(accelerator.device)
    own = {"gate_bias": cfg.gate_lr, "ssm.log_dt": cfg.dt_lr}  # parameters with their own learning rate
    rest = [p for n, p in compressor.named_parameters() if n not in own]
    param_groups = [{"params": rest}] + [{"params": [p], "own_lr": own[n], "weight_decay": 0.0}
                                         for n, p in compressor.named_parameters() if n in own]
    optimizer = torch.optim.AdamW(param_groups, lr=cfg.stage1_lr, weight_decay=cfg.weight_decay)
    groups: dict[int, list[int]] = {}
    for i, e in enumerate(teacher.episodes):
        groups.setdefault(e.group, []).append(i)
    schedule = Schedule([groups[g] for g in sorted(groups)], cfg)
    if len(schedule.steps) == 0:
        raise ValueError(f"no training steps: {len(groups)} groups with groups_per_step={cfg.groups_per_step}")
    start_step, history = 0, []
    if resume:
        start_step, history = load_checkpoint(out, compressor, optimizer)
    elif ccfg.standardize and not ccfg.control:
        compressor.fit_standardizer(training_states(model, compressor, teacher))
    raw = compressor
    rank, world = accelerator.process_index, accelerator.num_processes
    if cfg.groups_per_step % world:
        raise ValueError(f"groups_per_step={cfg.groups_per_step} must be a multiple of the {world} processes")
    t0 = time.perf_counter()
    for step in range(start_step, len(schedule.steps)):
        if stop_after is not None and step - start_step >= stop_after:
            break
        stage, group_ids = schedule.steps[step]
        lo, hi = schedule.stage_bounds(stage)
        base = cfg.stage1_lr if stage == 1 else cfg.stage2_lr
        for pg in optimizer.param_groups:
            pg["lr"] = pg.get("own_lr", base) * _lr_factor(step, lo, hi, cfg.warmup_ratio)
        mine = group_ids[rank::world]
        total = None
        logs: dict[str, float] = {}
        for gid in mine:
            episodes = [teacher.get(i) for i in schedule.groups[gid]]
            losses = group_losses(model, compressor, episodes, cfg, stage)
            part = losses["loss"] / len(mine)
            total = part if total is None else total + part
            for key, value in losses.items():
                logs[key] = logs.get(key, 0.0) + float(value.detach()) / len(mine)
        if not torch.isfinite(total):
            raise TrainingDiverged(
                f"loss became {total.item()} at step {step} (stage {stage}); the last good checkpoint is kept "
                f"in {str(out / 'checkpoint')!r}"
            )
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        _average_gradients(compressor, world)
        torch.nn.utils.clip_grad_norm_(compressor.parameters(), cfg.max_grad_norm)
        optimizer.step()
        if world > 1:  # the step's losses over all processes, as one process would log them
            import torch.distributed as dist

            names = sorted(logs)
            values = torch.tensor([logs[n] for n in names], dtype=torch.float64)
            dist.all_reduce(values)
            logs = {n: v / world for n, v in zip(names, values.tolist())}
        record = {"step": step, "stage": stage, "lr": optimizer.param_groups[0]["lr"], **logs,
                  "seconds": time.perf_counter() - t0}
        if raw.config.gate:  # how far the virtual tokens have been let in
            record["gate_mean"], record["gate_max"] = raw.gate_bias.mean().item(), raw.gate_bias.max().item()
        if raw.config.learn_dt:  # the learned steps, one per group
            record["dt"] = raw.ssm.log_dt.exp().tolist()
        history.append(record)
        if progress and accelerator.is_main_process:
            progress({**record, "total_steps": len(schedule.steps), "start_step": start_step})
        if (step + 1) % cfg.checkpoint_every == 0 and accelerator.is_main_process:
            save_checkpoint(out, raw, optimizer, step + 1, history)
        accelerator.wait_for_everyone()
    else:
        if accelerator.is_main_process:
            save_final(out, raw, cfg, history)
            if (out / "checkpoint").exists():
                shutil.rmtree(out / "checkpoint")
    return raw.eval()
