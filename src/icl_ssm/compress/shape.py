"""The compressor's shape (its SSM, head and cache layout), declared once, and its two named
presets: :data:`PAPER` (the paper's layout: virtual tokens after the sinks, no exact recent
tokens, no gates) and :data:`RECIPE` (the recipe measured best on SmolLM2-135M, what
``icl-ssm distill`` and ``icl-ssm run`` train by default: gated virtual tokens beside 16 exact
recent ones, the scale-invariant LegS system). :class:`~icl_ssm.compress.compressor.SSMCompressorConfig`
defaults to :data:`PAPER`; :class:`~icl_ssm.distill.config.DistillConfig` and
:class:`~icl_ssm.pipeline.config.RunConfig` to :data:`RECIPE`. What each field means is in
:data:`icl_ssm.distill.config.FIELD_HELP`."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class CompressorShape:
    """Every field that decides a compressor's parameters and its cache; the defaults are
    :data:`RECIPE`. ``num_groups`` 0: 4, capped at the teacher's layer count."""

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

    def overrides(self) -> dict:
        """The fields as ``SSMCompressorConfig.for_teacher`` keywords (``num_groups`` left to
        its default where 0)."""
        out = {name: getattr(self, name) for name in COMPRESSOR_FIELDS}
        if not out["num_groups"]:
            del out["num_groups"]
        return out


COMPRESSOR_FIELDS = tuple(f.name for f in fields(CompressorShape))
RECIPE = CompressorShape()
PAPER = replace(RECIPE, num_recent=0, gate=False, system="time_invariant")
