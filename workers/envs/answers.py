"""How a final reply becomes a trajectory's `answer` (`answer_format`): the whole stripped text, or the last number
in it in canonical form; the same canonical form for a task's gold answers."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Literal

AnswerFormat = Literal["text", "last_number"]
"""How the final reply becomes the trajectory's `answer`: the whole stripped text, or the last number in it."""

ANSWER_FORMATS: tuple[AnswerFormat, ...] = ("text", "last_number")


_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?|-?\.\d+")


def canonical_number(text: str) -> str | None:
    """ "1,200.50" -> "1200.5", "12.0" -> "12", "-0" -> "0"; None when `text` is not one decimal number."""
    cleaned = text.strip().replace(",", "")
    if not cleaned or not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)", cleaned):
        return None
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def extract_answer(text: str, answer_format: AnswerFormat) -> str | None:
    """The final answer in a reply: the stripped text ("text"; None if blank) or its last number in canonical
    form ("last_number"; None if it has none)."""
    if answer_format == "text":
        stripped = text.strip()
        return stripped or None
    matches = _NUMBER.findall(text)
    return canonical_number(matches[-1]) if matches else None
