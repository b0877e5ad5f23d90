"""The control cache: a compressor of the same shape whose head reads a learned constant instead
of the SSM state, so its virtual tokens cannot depend on the prompt (only its sinks and recent
tokens do). A compressor that ranks prompts no better than its control has not learned to
read them."""

from __future__ import annotations

from dataclasses import dataclass

from icl_ssm.compress.builders.compressed import CompressedCache


@dataclass(frozen=True)
class ControlCache(CompressedCache):
    """A :class:`CompressedCache` whose ``compressor`` must be a control (``config.control``);
    otherwise a ValueError."""

    name: str = "control"

    def __post_init__(self) -> None:
        if not self.compressor.config.control:
            raise ValueError("ControlCache: the compressor given is not a control (its config.control is False); "
                             "use CompressedCache for a trained compressor")
