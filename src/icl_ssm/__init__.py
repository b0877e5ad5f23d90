"""icl-ssm: demonstration selection with state space models distilled from a transformer."""

__version__ = "0.1.0"
