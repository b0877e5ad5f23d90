"""The SSM compressor (the paper's Section 3.1): a prompt of demonstrations -> ``n_virtual``
key/value tokens for every layer of a frozen teacher.

The teacher's m layers are split into g groups of consecutive layers. Each group has an SSM
(frozen HiPPO-LegS transition shared by all, learned input matrix over the teacher's *token
embeddings*) and a head that turns the SSM's final state into ``n_virtual`` (K, V) pairs for
each layer of the group, with the teacher's ``num_key_value_heads`` and ``head_dim``.

The paper's head is one MLP from the state to all ``L_g * 2 * H_kv * n_v * d`` outputs, about
0.5 B parameters for Qwen2.5-1.5B. Here the head is factored: the state becomes ``n_virtual``
latent tokens of size ``latent_size`` per group (shared by the group's layers), then every
layer has its own small linear map latent -> (K, V). For SmolLM2-135M that is about 5% of the
teacher's parameters, for Qwen2.5-1.5B about 0.6% (see :func:`parameter_budget`).

``control=True`` feeds the head a learned constant instead of the SSM state: the
prompt-independent lower bar that an SSM must beat to show it carries the prompt.

Paper: Zhang et al., "Long-Context Demonstration Selection Using State Space Models".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import PreTrainedConfig, PreTrainedModel

from icl_ssm import schema
from icl_ssm.compress.shape import PAPER
from icl_ssm.ssm.layer import SYSTEMS, HiPPOSSM, validate_channels, validate_learn_dt
from icl_ssm.ssm.products import ShiftProducts

POSITIONS = ("compressed", "original")


@strict
class SSMCompressorConfig(PreTrainedConfig):
    """Every hyperparameter of a compressor, and the shape of the teacher it serves.

    ``position``: where the query's position ids start after the compressed cache,
    ``"compressed"`` (the paper's code: at ``num_sink + num_virtual``, the cache length) or
    ``"original"`` (at the uncompressed prompt's length, as if the prompt were still there).

    ``num_recent`` > 0 makes a hybrid cache: the last ``num_recent`` prompt tokens are kept as
    real tokens, re-encoded by the teacher on top of the sinks and virtual tokens (which then
    summarise only what comes before them). Recency carries much of what distinguishes one
    demonstration subset from another; this keeps it exact for a cost of ``num_recent``
    teacher tokens.

    ``standardize`` centres and scales every state coordinate by its mean and standard
    deviation over prompts (buffers ``state_mean``/``state_std``, measured once on the training
    prompts by :meth:`SSMCompressor.fit_standardizer`) before the head. A state that averages a
    long prompt moves little from one prompt to the next (about 1% at k = 50 with 256
    channels); the head then sees those differences at unit scale rather than as a ripple on
    what every prompt shares.

    ``pair_size`` = P > 0 makes the SSM scan, beside what ``ssm_input`` names, P products of each
    token with a learned causal filter of the ``pair_window`` tokens before it
    (:class:`~icl_ssm.ssm.products.ShiftProducts`, H3's multiplicative input): a linear state
    can then sum interactions of neighbouring tokens, such as a label with its text.

    ``input_rank`` = r > 0 puts one learned ``(H [+ P]) -> r`` projection, shared by the layer
    groups, in front of the scan: the SSM's input matrices then read r numbers per token instead
    of H + P, which cuts the per-token cost of the scan's input from ``G N (H + P)`` to
    ``(H + P) r + G N r`` multiply-adds (what bounds the cache's FLOP saving on a small teacher;
    the scale-invariant scan's cost beyond that does not depend on the input width, the
    time-invariant one's follows its own plan).

    ``gate`` adds a learned bias per virtual token to every attention logit that reads it
    (``gate_init`` at the start). A strongly negative start makes the virtual tokens all but
    invisible: the untrained cache is then the sinks (plus the recent tokens) alone, and
    training opens each gate only as far as the distillation loss gains from it.
    """

    model_type = "icl_ssm_compressor"

    teacher_name: str = ""
    teacher_num_layers: int = 4  # with num_groups=4: the default config is a valid one (transformers builds it)
    teacher_num_kv_heads: int = 1
    teacher_head_dim: int = 8
    teacher_hidden_size: int = 16
    teacher_vocab_size: int = 100
    teacher_num_parameters: int = 0

    # the shape: the paper's layout by default (icl_ssm.compress.shape.PAPER, where it is declared)
    state_size: int = PAPER.state_size
    channels: int = PAPER.channels
    num_groups: int = 4  # PAPER's 0 resolved (for_teacher caps it at the teacher's layers)
    num_virtual: int = PAPER.num_virtual
    num_sink: int = PAPER.num_sink
    num_recent: int = PAPER.num_recent
    latent_size: int = PAPER.latent_size
    system: str = PAPER.system
    dt: float = PAPER.dt
    learn_dt: bool = PAPER.learn_dt
    method: str = PAPER.method
    control: bool = PAPER.control
    standardize: bool = PAPER.standardize
    position: str = PAPER.position
    gate: bool = PAPER.gate
    gate_init: float = PAPER.gate_init
    ssm_input: str = PAPER.ssm_input
    pair_size: int = PAPER.pair_size
    pair_window: int = PAPER.pair_window
    input_rank: int = PAPER.input_rank
    initializer_range: float = 0.02

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        for name in ("teacher_num_layers", "teacher_num_kv_heads", "teacher_head_dim",
                     "teacher_hidden_size", "state_size", "num_groups", "num_virtual", "latent_size"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value}")
        if self.teacher_vocab_size < 0:  # 0: a teacher that reads value vectors, not token ids
            raise ValueError(f"teacher_vocab_size must be >= 0, got {self.teacher_vocab_size}")
        for name in ("num_sink", "num_recent", "pair_size", "input_rank"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.num_groups > self.teacher_num_layers:
            raise ValueError(
                f"num_groups={self.num_groups} exceeds the teacher's {self.teacher_num_layers} layers"
            )
        if self.system not in SYSTEMS:
            raise ValueError(f"system must be one of {SYSTEMS}, got {self.system!r}")
        if self.position not in POSITIONS:
            raise ValueError(f"position must be one of {POSITIONS}, got {self.position!r}")
        if not (math.isfinite(self.dt) and self.dt > 0):
            raise ValueError(f"dt must be a finite number > 0, got {self.dt}")
        validate_learn_dt(self.learn_dt, self.system)
        validate_channels(self.channels, self.state_size)
        self.input_layer  # noqa: B018 - validates ssm_input
        if self.pair_window <= 0:
            raise ValueError(f"pair_window must be a positive integer, got {self.pair_window}")
        if not math.isfinite(self.gate_init):
            raise ValueError(f"gate_init must be a finite number, got {self.gate_init}")

    @classmethod
    def for_teacher(cls, teacher_config: PreTrainedConfig, name: str = "", num_parameters: int = 0,
                    **overrides) -> SSMCompressorConfig:
        """A config whose teacher fields are read from ``teacher_config``; the default
        ``num_groups`` (4) is capped at the teacher's layer count."""
        overrides.setdefault("num_groups", min(4, teacher_config.num_hidden_layers))
        return cls(
            teacher_name=name or getattr(teacher_config, "_name_or_path", "") or "",
            teacher_num_layers=teacher_config.num_hidden_layers,
            teacher_num_kv_heads=kv_heads(teacher_config),
            teacher_head_dim=head_dim(teacher_config),
            teacher_hidden_size=teacher_config.hidden_size,
            teacher_vocab_size=getattr(teacher_config, "vocab_size", 0),  # 0: a teacher that reads vectors
            teacher_num_parameters=num_parameters,
            **overrides,
        )

    def layer_groups(self) -> list[list[int]]:
        """Consecutive layer indices per group, sizes differing by at most one."""
        m, g = self.teacher_num_layers, self.num_groups
        bounds = [i * (m // g) + min(i, m % g) for i in range(g + 1)]  # numpy.array_split's rule
        return [list(range(bounds[i], bounds[i + 1])) for i in range(g)]

    @property
    def input_layer(self) -> int:
        """0 for ``ssm_input="embeddings"``, ``l`` for ``"layer:l"`` (1 <= l < the teacher's layers)."""
        if self.ssm_input == "embeddings":
            return 0
        kind, _, value = self.ssm_input.partition(":")
        if kind != "layer" or not value.isdigit() or not 1 <= int(value) < self.teacher_num_layers:
            raise ValueError(f"ssm_input={self.ssm_input!r}; accepted: 'embeddings' or 'layer:l' with "
                             f"1 <= l < {self.teacher_num_layers} (the teacher's layers)")
        return int(value)

    @property
    def cache_length(self) -> int:
        return self.num_sink + self.num_virtual + self.num_recent


def kv_heads(config: PreTrainedConfig) -> int:
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def head_dim(config: PreTrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


TEACHER_FIELDS = {
    "teacher_num_layers": ("num_hidden_layers", lambda c: c.num_hidden_layers),
    "teacher_num_kv_heads": ("num_key_value_heads", kv_heads),
    "teacher_head_dim": ("head_dim", head_dim),
    "teacher_hidden_size": ("hidden_size", lambda c: c.hidden_size),
    "teacher_vocab_size": ("vocab_size", lambda c: getattr(c, "vocab_size", 0)),
}


def teacher_mismatches(config: SSMCompressorConfig, teacher_config: PreTrainedConfig) -> list[str]:
    """Human-readable differences between the teacher a compressor was built for and another."""
    out = []
    for field, (name, read) in TEACHER_FIELDS.items():
        mine, theirs = getattr(config, field), read(teacher_config)
        if mine != theirs:
            out.append(f"{name}: compressor has {mine}, model has {theirs}")
    return out


@dataclass
class VirtualKV:
    """Virtual tokens for every teacher layer: ``keys``/``values: (m, B, H_kv, n_v, d)``."""

    keys: Tensor
    values: Tensor


class SSMCompressor(PreTrainedModel):
    """Prompt token embeddings ``(B, T, H)`` -> :class:`VirtualKV` for every teacher layer."""

    config_class = SSMCompressorConfig
    base_model_prefix = "compressor"
    main_input_name = "inputs_embeds"

    def __init__(self, config: SSMCompressorConfig):
        super().__init__(config)
        c = config
        G, N, V, R = c.num_groups, c.state_size, c.num_virtual, c.latent_size
        m, Hkv, d = c.teacher_num_layers, c.teacher_num_kv_heads, c.teacher_head_dim
        if c.pair_size:
            self.products = ShiftProducts(c.teacher_hidden_size, c.pair_size, c.pair_window)
        scanned = c.teacher_hidden_size + c.pair_size
        if c.input_rank:
            self.input_proj = nn.Linear(scanned, c.input_rank, bias=False)
            scanned = c.input_rank
        self.ssm = HiPPOSSM(N, scanned, G, c.system, c.dt, c.method, learn_dt=c.learn_dt, channels=c.channels)
        self.constant = nn.Parameter(torch.zeros(G, N))  # the control's "state"
        self.state_scale = nn.Parameter(torch.ones(G, N))
        self.state_shift = nn.Parameter(torch.zeros(G, N))
        self.to_latent = nn.Parameter(torch.empty(G, N, V * R))
        self.latent_bias = nn.Parameter(torch.zeros(G, V * R))
        self.latent_pos = nn.Parameter(torch.empty(G, V, R))
        self.to_kv = nn.Parameter(torch.empty(m, R, 2 * Hkv * d))
        self.kv_bias = nn.Parameter(torch.zeros(m, 2 * Hkv * d))
        if c.gate:
            self.gate_bias = nn.Parameter(torch.full((V,), float(c.gate_init)))
        if c.standardize:
            self.register_buffer("state_mean", torch.zeros(G, N))
            self.register_buffer("state_std", torch.ones(G, N))
        self.group_of_layer = [g for g, layers in enumerate(c.layer_groups()) for _ in layers]
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        if module is not self:
            return
        std = self.config.initializer_range
        nn.init.normal_(self.to_latent, std=1 / math.sqrt(self.config.state_size))
        nn.init.normal_(self.latent_pos, std=std)
        nn.init.normal_(self.to_kv, std=1 / math.sqrt(self.config.latent_size))

    def states(self, inputs_embeds: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """SSM final states ``(B, G, N)`` of ``inputs_embeds: (B, T, H)`` (with ``pair_size``, of
        them and their :class:`ShiftProducts`); the control's learned constant when ``control``."""
        B = inputs_embeds.shape[0]
        if self.config.control:
            return self.constant[None].expand(B, -1, -1).to(inputs_embeds.dtype)
        if self.config.pair_size:
            inputs_embeds = torch.cat([inputs_embeds, self.products(inputs_embeds, attention_mask)], dim=-1)
        if self.config.input_rank:
            inputs_embeds = self.input_proj(inputs_embeds)
        return self.ssm(inputs_embeds, attention_mask)

    def head(self, states: Tensor) -> VirtualKV:
        """``states: (B, G, N)`` -> virtual K/V ``(m, B, H_kv, n_v, d)`` each."""
        c = self.config
        B = states.shape[0]
        V, R = c.num_virtual, c.latent_size
        Hkv, d = c.teacher_num_kv_heads, c.teacher_head_dim
        if c.standardize and not c.control:
            states = (states - self.state_mean.to(states.dtype)) / self.state_std.to(states.dtype)
        s = F.layer_norm(states, (c.state_size,)) * self.state_scale + self.state_shift  # (B, G, N)
        z = torch.einsum("bgn,gnk->bgk", s, self.to_latent) + self.latent_bias  # (B, G, V*R)
        z = F.gelu(z).view(B, -1, V, R) + self.latent_pos  # (B, G, V, R)
        z = F.layer_norm(z, (R,))
        index = torch.tensor(self.group_of_layer, device=z.device)
        z = z[:, index]  # (B, m, V, R): each layer reads its group's latents
        kv = torch.einsum("bmvr,mrk->mbvk", z, self.to_kv) + self.kv_bias[:, None, None]  # (m, B, V, 2*Hkv*d)
        kv = kv.view(-1, B, V, 2, Hkv, d).permute(3, 0, 1, 4, 2, 5)  # (2, m, B, Hkv, V, d)
        return VirtualKV(keys=kv[0], values=kv[1])

    @torch.no_grad()
    def fit_standardizer(self, states: Tensor, eps: float = 1e-6) -> None:
        """Set ``state_mean``/``state_std`` from SSM states ``(n, G, N)`` of n >= 2 prompts."""
        if not self.config.standardize:
            raise ValueError("fit_standardizer: this compressor has standardize=False")
        if states.ndim != 3 or states.shape[0] < 2 or states.shape[1:] != self.state_mean.shape:
            raise ValueError(f"states must be (n >= 2, {', '.join(map(str, self.state_mean.shape))}), "
                             f"got {tuple(states.shape)}")
        states = states.double()
        self.state_mean.copy_(states.mean(0))
        self.state_std.copy_(states.std(0).clamp_min(eps))

    def slot_bias(self, batch: int) -> Tensor:
        """Attention-logit bias of the cache's sink and virtual slots ``(batch, num_sink + num_virtual)``:
        0 for the exact sinks, the learned gate for the virtual tokens (``gate`` only)."""
        if not self.config.gate:
            raise ValueError("slot_bias: this compressor has gate=False")
        bias = torch.cat([self.gate_bias.new_zeros(self.config.num_sink), self.gate_bias])
        return bias[None].expand(batch, -1)

    def forward(self, inputs_embeds: Tensor, attention_mask: Tensor | None = None) -> VirtualKV:
        """``inputs_embeds: (B, T, H)`` (the teacher's token embeddings of the prompt),
        ``attention_mask: (B, T)`` -> :class:`VirtualKV`."""
        H = self.config.teacher_hidden_size
        if inputs_embeds.ndim != 3 or inputs_embeds.shape[-1] != H:
            raise ValueError(
                f"inputs_embeds must be (batch, T, {H}) token embeddings of the teacher, "
                f"got {tuple(inputs_embeds.shape)}"
            )
        return self.head(self.states(inputs_embeds, attention_mask))

    def validate_teacher(self, teacher_config: PreTrainedConfig) -> None:
        """Refuse a teacher of another shape, naming every difference."""
        problems = teacher_mismatches(self.config, teacher_config)
        if problems:
            raise ValueError(
                f"this compressor was built for teacher {self.config.teacher_name!r} and cannot "
                "serve this model: " + "; ".join(problems)
            )


def parameter_budget(teacher_config: PreTrainedConfig, teacher_parameters: int, **overrides) -> dict:
    """The compressor's parameter count for a teacher, computed from configs alone."""
    config = SSMCompressorConfig.for_teacher(teacher_config, **overrides)
    with torch.device("meta"):
        n = sum(p.numel() for p in SSMCompressor(config).parameters())
    return {"compressor_params": n, "teacher_params": teacher_parameters,
            "param_fraction": n / teacher_parameters if teacher_parameters else None}


_JSON_TYPES = {bool: schema.BOOLEAN, int: schema.INTEGER, float: schema.NUMBER, str: schema.STRING}
_SAVED_KEYS = ("architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype")


@cache
def config_schema() -> dict:
    """``config.json`` of a saved compressor: every field of :class:`SSMCompressorConfig` with
    its type, the keys transformers writes into any configuration, and no other key."""
    own = {name: _JSON_TYPES[type(getattr(SSMCompressorConfig, name))] for name in SSMCompressorConfig.__annotations__
           if type(getattr(SSMCompressorConfig, name, None)) in _JSON_TYPES}
    known = {key: {} for key in (*PreTrainedConfig().to_dict(), *_SAVED_KEYS)}
    return schema.record({**known, **own, "model_type": {"const": SSMCompressorConfig.model_type}},
                         required=("model_type",), closed=True)


def check_compressor_dir(path: str | Path) -> Path:
    """``path`` as a :class:`Path` if it holds a saved compressor's files; else a ValueError naming it."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"compressor directory {str(path)!r} does not exist")
    inside = [sub.name for sub in sorted(path.iterdir()) if (sub / "config.json").is_file()]
    for name in ("config.json", "model.safetensors"):
        if not (path / name).is_file():
            hint = (f"; it holds compressors in {', '.join(repr(str(path / sub)) for sub in inside)}: pass "
                    f"{str(path / inside[0])!r}" + (" (the control is the prompt-independent comparison)"
                                                    if "control" in inside else "")) if inside else (
                "; expected the output of SSMCompressor.save_pretrained")
            raise ValueError(f"compressor directory {str(path)!r} has no {name}{hint}")
    schema.load(path / "config.json", config_schema())
    return path


def load_compressor(path: str | Path, teacher_config: PreTrainedConfig | None = None,
                    **kwargs) -> SSMCompressor:
    """Load a saved compressor; refuse a missing or corrupted checkpoint, or another teacher's."""
    path = check_compressor_dir(path)
    try:
        from safetensors import safe_open

        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            list(f.keys())
        model = SSMCompressor.from_pretrained(str(path), **kwargs)
    except ValueError as err:  # a value the configuration refuses: name the file it came from
        raise ValueError(f"{path / 'config.json'}: {err}") from err
    except Exception as err:  # safetensors, json and OS errors: one clear message
        raise ValueError(
            f"compressor checkpoint {str(path / 'model.safetensors')!r} could not be read "
            f"(truncated or corrupted?): {type(err).__name__}: {err}"
        ) from err
    if teacher_config is not None:
        model.validate_teacher(teacher_config)
    return model.eval()
