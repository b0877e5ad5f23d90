"""The random baseline: ``k`` candidates drawn uniformly."""

from __future__ import annotations

from icl_ssm.select.base import Selection, Selector, register, top_k, validate_selection_inputs


@register("random")
class RandomSelector(Selector):
    """``k`` candidates uniformly at random: the baseline every method must beat."""

    def select(self, pool, validation, k, rng):
        validate_selection_inputs(pool, validation, k)
        scores = rng.random(len(pool))
        return Selection(self.name, top_k(scores, k), scores)
