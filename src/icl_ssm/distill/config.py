"""One distillation run's config: :class:`DistillConfig`, what each field means
(:data:`FIELD_HELP`, the ``icl-ssm distill`` flags' help) and the named recipes
(:data:`RECIPES`: the measured one and the paper's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from icl_ssm.compress.shape import COMPRESSOR_FIELDS, PAPER, RECIPE, CompressorShape
from icl_ssm.distill.losses import RANK_LEVELS
from icl_ssm.distill.spec import validate_shared_tail
from icl_ssm.ssm.layer import validate_learn_dt


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
    # compressor: the measured recipe's shape (icl_ssm.compress.shape.RECIPE, where it is declared)
    state_size: int = RECIPE.state_size
    channels: int = RECIPE.channels
    num_groups: int = RECIPE.num_groups
    num_virtual: int = RECIPE.num_virtual
    num_sink: int = RECIPE.num_sink
    num_recent: int = RECIPE.num_recent
    latent_size: int = RECIPE.latent_size
    system: str = RECIPE.system
    dt: float = RECIPE.dt
    learn_dt: bool = RECIPE.learn_dt
    dt_lr: float = 0.05
    method: str = RECIPE.method
    control: bool = RECIPE.control
    standardize: bool = RECIPE.standardize
    position: str = RECIPE.position
    gate: bool = RECIPE.gate
    gate_init: float = RECIPE.gate_init
    ssm_input: str = RECIPE.ssm_input
    pair_size: int = RECIPE.pair_size
    pair_window: int = RECIPE.pair_window
    input_rank: int = RECIPE.input_rank
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

    @property
    def shape(self) -> CompressorShape:
        """The compressor this run trains (its :data:`~icl_ssm.compress.shape.COMPRESSOR_FIELDS`)."""
        return CompressorShape(**{name: getattr(self, name) for name in COMPRESSOR_FIELDS})

    def compressor_overrides(self) -> dict:
        return self.shape.overrides()

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
PAPER_RECIPE = {**{name: value for name, value in PAPER.overrides().items() if value != getattr(RECIPE, name)},
                "lambda_rank": 0.0, "stage2_lr": 5e-5, "stage2_epochs": 1.0, "warmup_ratio": 0.05}


RECIPES: dict[str, dict] = {"measured": {}, "paper": PAPER_RECIPE}
