"""The cell rules a WideSearch task names in its evaluation spec (`ByteDance-Seed/WideSearch`,
src/evaluation/metric_utils.py), for the columns of an imported task (`workers.swarm.widesearch`) or any task that
asks for them in its `table` field: the preprocessors a column's cells go through first (`preprocess`, applied to
the predicted and the gold cell alike) and the metrics `in_match`, `date_near` and `url_match`.
`workers.rewards.table_score.cell_score` dispatches to them; `exact_match`, `number_near`, `contains` and the set
metrics are its own.

As in WideSearch:
- `norm_str`: lowercased, spaces and asterisks removed; `extract_number`: the first number or percentage of the
  text ("NULL" when there is none); `norm_date`: a date as YYYY-MM-DD (the text unchanged when it is no date);
- `in_match`: 1 when the predicted text is inside the gold text;
- `date_near`: 1 when both dates are within 31 days of each other, and 1 when neither side reads as a date (as the
  source does); a day-less date is the first of its month;
- `url_match`: 1 when the URLs of both cells have the same set of hosts, or, when neither names a host, the same
  set of URLs.

One departure: WideSearch parses dates with the `dateparser` package (any language, relative dates); here a fixed
list of English and numeric layouts is read (`DATE_FORMATS`), and anything else is "no date".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import date, datetime
from urllib.parse import urlparse

PREPROCESSORS = ("norm_str", "extract_number", "norm_date")
DATE_NEAR_DAYS = 31

_NUMBER = re.compile(r"[-+]?\d*\.\d+%?|[-+]?\d+\.?\d*%?")
_URL = re.compile(r"(?:https?://|www\.)[^\s<>\"'|\])]+", re.IGNORECASE)
DATE_FORMATS = (
    "%Y-%m-%d",
    "%Y/%m/%d",
    "%Y.%m.%d",
    "%d %B %Y",
    "%d %b %Y",
    "%B %d %Y",
    "%b %d %Y",
    "%B %d, %Y",
    "%b %d, %Y",
    "%m/%d/%Y",
    "%Y-%m",
    "%B %Y",
    "%b %Y",
    "%Y",
)


def norm_str(text: str) -> str:
    return str(text).lower().strip().replace(" ", "").replace("*", "")


def extract_number(text: str) -> str:
    found = _NUMBER.findall(str(text).replace(",", ""))
    return found[0] if found else "NULL"


def parse_date(text: str) -> date | None:
    """The date `text` writes in one of `DATE_FORMATS` (ordinals such as "3rd" read as "3"), or None."""
    value = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", " ".join(str(text).replace(",", ", ").split())).strip()
    for layout in DATE_FORMATS:
        try:
            return datetime.strptime(value, layout).date()
        except ValueError:
            continue
    return None


def norm_date(text: str) -> str:
    parsed = parse_date(text)
    return parsed.isoformat() if parsed is not None else text


_PREPROCESS: dict[str, Callable[[str], str]] = {
    "norm_str": norm_str,
    "extract_number": extract_number,
    "norm_date": norm_date,
}


def preprocess(text: str, steps: Sequence[str]) -> str:
    """`text` through each named preprocessor in order."""
    for step in steps:
        text = _PREPROCESS[step](text)
    return text


def in_match(predicted: str, gold: str) -> float:
    return 1.0 if predicted and predicted in gold else 0.0


def date_near(predicted: str, gold: str) -> float:
    a, b = parse_date(predicted), parse_date(gold)
    if a is None or b is None:
        return 1.0 if a is None and b is None else 0.0
    return 1.0 if abs((a - b).days) <= DATE_NEAR_DAYS else 0.0


def _hosts(urls: list[str]) -> set[str]:
    hosts = set()
    for url in urls:
        try:
            host = urlparse(url if "://" in url else f"http://{url}").hostname
        except ValueError:
            host = None
        if host:
            hosts.add(host.lower())
    return hosts


def url_match(predicted: str, gold: str) -> float:
    pred_urls, gold_urls = _URL.findall(predicted), _URL.findall(gold)
    pred_hosts, gold_hosts = _hosts(pred_urls), _hosts(gold_urls)
    if pred_hosts and gold_hosts:
        return 1.0 if pred_hosts == gold_hosts else 0.0
    if not pred_hosts and not gold_hosts:
        return 1.0 if set(pred_urls) == set(gold_urls) else 0.0
    return 0.0
