"""Validators several apps share."""

from __future__ import annotations

import re

SLUG = re.compile(r"[-a-zA-Z0-9_]{1,100}")
"""Names people type and URLs carry (datasets, reward configs, gates, queues, benchmarks): 1-100 of [-a-zA-Z0-9_]."""
