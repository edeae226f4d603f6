"""What the launch pages share (the coding generator, search task generation, the SFT and training forms): the
posted values to show again after an error, the number fields of a pydantic model with their defaults and help,
and those numbers read back from the form."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.http import HttpRequest
from pydantic import BaseModel


def posted_values(request: HttpRequest) -> dict[str, Any]:
    """The posted form's values (the CSRF token left out), so a form shown again keeps what was typed."""
    return {k: str(v) for k, v in request.POST.items() if k != "csrfmiddlewaretoken"}


def number_fields(model: type[BaseModel], names: Iterable[str], values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The form fields of `model`'s numbers: each one's name, the value typed (else the model's default) and the
    field's description as its help text."""
    defaults = model()
    return [
        {
            "name": name,
            "value": values.get(name, getattr(defaults, name)),
            "help": model.model_fields[name].description or "",
        }
        for name in names
    ]


def posted_numbers(post: Any, names: Iterable[str]) -> dict[str, Any]:
    """The numbers typed in the form: a blank field is left out (the model's default applies); a value that is not
    a number is passed on as typed, so the model's own check names the field."""
    numbers: dict[str, Any] = {}
    for name in names:
        raw = post.get(name, "").strip()
        if not raw:
            continue
        try:
            numbers[name] = int(raw) if raw.lstrip("-").isdigit() else float(raw)
        except ValueError:
            numbers[name] = raw
    return numbers
