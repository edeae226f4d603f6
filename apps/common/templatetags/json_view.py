"""`{{ value|json_pretty }}`: a stored JSON value as indented JSON (what the API returns), never Python's repr."""

from __future__ import annotations

import json

from django import template

register = template.Library()


@register.filter
def json_pretty(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
