"""`{{ terms|reward_terms }}`: a trajectory's reward by term in words ("normalized_match 1.000 · length −0.020"),
not a Python dict, on the run and trajectory pages."""

from __future__ import annotations

import math
from collections.abc import Mapping

from django import template

register = template.Library()


@register.filter
def reward_terms(terms: object) -> str:
    """Each term's name and value, in the stored order; a value that is not a number is shown as it is."""
    if not isinstance(terms, Mapping) or not terms:
        return "none"
    parts = []
    for name, value in terms.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            number = f"{value:.3f}".replace("-", "\u2212")  # a typographic minus
            parts.append(f"{name} {number}")
        else:
            parts.append(f"{name} {value}")
    return " · ".join(parts)
