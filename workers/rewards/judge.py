"""Generative reward models with rubrics (Kimi K2.5, docs/methods.md section 1, "Rewards, GRMs, RFT"): a judge model
scores a trajectory against the criteria of a rubric, "on top of verified reward signals".

The judge is any built-in model or model directory (a trained checkpoint exported by SFT included), loaded once
per process by the transformers backend (`workers.models.frozen`) and decoding greedily. It sees the task, the
final answer and the last turns (`trajectory_view`, cut to `max_chars`), and is asked for one line per criterion,
`<criterion>: <score>/<scale>` (`judge_messages`). `parse_scores` reads the lines back: a criterion the judge gave
no readable score for scores 0 and is reported as unparsed. The term's value is the weighted mean of the criterion
scores divided by the scale, in [0, 1].

A judgement (per-criterion scores, the judge's text as evidence, how long it took) is keyed by the SHA-256 of the
judge, the rubric, the scale and the trajectory view, and cached in this process and on disk
(`$CRUCIBLE_JUDGE_CACHE`, default `~/.cache/crucible/judgements`), so scoring the same trajectory twice asks the
judge once. The rollout worker stores each judgement with the trajectory record (`judgements`, by term name);
scoring a record that carries its judgement for the same key never calls the model. The trajectory page scores
within `stored_judgements_only()`: a record without its judgement is reported as not judged, never judged in the
web request.

The sources publish no rubric text ("multiple alternative GRM rubrics tailored to different task contexts");
`DEFAULT_CRITERIA` follows the criteria they name.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workers.models.base import SamplingParams
from workers.models.frozen import frozen_backend

DEFAULT_CRITERIA: tuple[tuple[str, str], ...] = (
    ("helpfulness", "Does the final answer give the user what the task asked for?"),
    ("instruction_following", "Does it follow every instruction of the task, including the requested format?"),
    ("relevance", "Is everything in it relevant to the task, with nothing made up?"),
    ("detail", "Is it as detailed as the task needs, and no more?"),
)
"""Kimi K2.5 names helpfulness, response readiness, contextual relevance, level of detail, aesthetic quality and
strict instruction following; these four fit text answers."""

_LINE = re.compile(r"^\W*([A-Za-z][\w ]*?)\W*[:=-]\s*(\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?", re.MULTILINE)


@dataclass
class Judgement:
    """One judge's verdict on one trajectory: `scores` per criterion (None: unreadable), the weighted `score` in
    [0, 1], the judge's `text` (the evidence) and its cache `key`."""

    key: str
    judge: str
    scores: dict[str, float | None]
    score: float
    text: str
    seconds: float = 0.0
    cached: bool = False
    unparsed: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def trajectory_view(record: Mapping[str, Any], max_chars: int) -> str:
    """What the judge reads: the task, the final answer and, as space allows, the last turns before it."""
    turns = [t for t in record.get("turns") or [] if isinstance(t, Mapping)]
    task = next((str(t.get("content") or "") for t in turns if t.get("role") == "user"), "")
    answer = str(record.get("answer") or "")
    head = f"TASK:\n{task[: max_chars // 3]}\n\nFINAL ANSWER:\n{answer[: max_chars // 3]}\n"
    header = "\nLAST STEPS:\n"
    budget = max(0, max_chars - len(head) - len(header))
    tail: list[str] = []
    for turn in reversed(turns[1:]):
        line = f"[{turn.get('role')}{' ' + str(turn.get('tool')) if turn.get('tool') else ''}] {turn.get('content')}"
        line = " ".join(line.split())[:400]
        if len(line) + 1 > budget:
            break
        tail.append(line)
        budget -= len(line) + 1
    return head + (header + "\n".join(reversed(tail)) if tail else "")


def judge_messages(criteria: Sequence[tuple[str, str]], view: str, scale: int) -> list[dict[str, str]]:
    lines = "\n".join(f"- {name}: {description}" for name, description in criteria)
    form = "\n".join(f"{name}: <score>/{scale}" for name, _ in criteria)
    return [
        {
            "role": "system",
            "content": "You grade an AI agent's work against a rubric. Score each criterion from 0 (worst) to "
            f"{scale} (best). Reply with exactly one line per criterion, in this form:\n{form}",
        },
        {"role": "user", "content": f"RUBRIC:\n{lines}\n\n{view}"},
    ]


def parse_scores(text: str, names: Sequence[str], scale: int) -> dict[str, float | None]:
    """Each criterion's score from lines `name: 7/10` (or `name: 7`), clamped to [0, scale]; None when absent."""
    wanted = {re.sub(r"[\W_]+", "", name.lower()): name for name in names}
    out: dict[str, float | None] = dict.fromkeys(names)
    for match in _LINE.finditer(text):
        name = wanted.get(re.sub(r"[\W_]+", "", match.group(1).lower()))
        if name is None or out[name] is not None:
            continue
        value = float(match.group(2))
        denominator = float(match.group(3)) if match.group(3) else float(scale)
        if denominator <= 0:
            continue
        out[name] = min(max(value * scale / denominator, 0.0), float(scale))
    return out


def judgement_key(judge: str, criteria: Sequence[tuple[str, str, float]], scale: int, view: str) -> str:
    payload = json.dumps({"judge": judge, "criteria": list(criteria), "scale": scale, "view": view}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


class JudgementCache:
    """Judgements by key: in memory, and as one JSON file per key under `root` (shared by the processes of a node)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root
        self._memory: dict[str, Judgement] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Judgement | None:
        with self._lock:
            if key in self._memory:
                return self._memory[key]
        if self.root is not None:
            path = self.root / f"{key}.json"
            try:
                found = Judgement(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                return None
            with self._lock:
                self._memory[key] = found
            return found
        return None

    def put(self, judgement: Judgement) -> None:
        with self._lock:
            self._memory[judgement.key] = judgement
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)
            path = self.root / f"{judgement.key}.json"
            staging = path.with_suffix(f".{os.getpid()}.tmp")
            staging.write_text(json.dumps(judgement.to_json()))
            staging.replace(path)  # a reader never sees half a file


def _default_root() -> Path:
    return Path(os.environ.get("CRUCIBLE_JUDGE_CACHE") or Path.home() / ".cache" / "crucible" / "judgements")


CACHE = JudgementCache(_default_root())


_models_allowed: contextvars.ContextVar[bool] = contextvars.ContextVar("judge_models_allowed", default=True)


class JudgeUnavailable(RuntimeError):
    """A judgement was needed where no judge model may run (a web request) and none is stored or cached."""


@contextlib.contextmanager
def stored_judgements_only() -> Iterator[None]:
    """Within this block a judgement comes from the record or the cache only; needing the model raises
    `JudgeUnavailable` (the control plane re-scores pages this way: a web request never loads a model)."""
    token = _models_allowed.set(False)
    try:
        yield
    finally:
        _models_allowed.reset(token)


def judge_trajectory(
    record: Mapping[str, Any],
    *,
    term_name: str,
    judge: str,
    criteria: Sequence[tuple[str, str, float]],
    scale: int,
    max_new_tokens: int,
    max_chars: int,
) -> Judgement:
    """The judgement of `record` (see the module docstring): the one stored with the record under `term_name` when
    its key matches, else the cached one, else the judge model's, cached."""
    view = trajectory_view(record, max_chars)
    key = judgement_key(judge, criteria, scale, view)
    stored = (record.get("judgements") or {}).get(term_name) if isinstance(record.get("judgements"), Mapping) else None
    if isinstance(stored, Mapping) and stored.get("key") == key:
        try:
            return Judgement(**{**stored, "cached": True})
        except TypeError:
            pass
    hit = CACHE.get(key)
    if hit is not None:
        return Judgement(**{**hit.to_json(), "cached": True})
    if not _models_allowed.get():
        raise JudgeUnavailable(
            f"term {term_name!r}: this record carries no judgement by {judge} for its current content, and no judge "
            "model runs here; re-score it in a job (a re-scoring run) to judge it"
        )

    started = time.perf_counter()
    backend, lock = frozen_backend(judge)
    messages = judge_messages([(name, description) for name, description, _ in criteria], view, scale)
    with lock:
        prompt = backend.encode_chat(messages)
        generation = backend.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))[0]
    text = str(generation.text)
    scores = parse_scores(text, [name for name, _, _ in criteria], scale)
    total_weight = sum(weight for _, _, weight in criteria) or 1.0
    value = sum(weight * (scores[name] or 0.0) for name, _, weight in criteria) / (total_weight * scale)
    judgement = Judgement(
        key=key,
        judge=judge,
        scores=scores,
        score=min(max(value, 0.0), 1.0),
        text=text,
        seconds=time.perf_counter() - started,
        unparsed=[name for name, score in scores.items() if score is None],
    )
    CACHE.put(judgement)
    return judgement


@dataclass(frozen=True)
class Agreement:
    """How a judged term agrees with a code-verified term over the same trajectories: `n` pairs, Pearson's r (None
    when either side is constant), the share of trajectories on which both sides pass or both fail (each side
    passing at `threshold`), and the judge's mean score where the verified term passes and where it fails."""

    judged: str
    verified: str
    n: int
    pearson: float | None
    agreement: float
    judge_mean_when_passed: float | None
    judge_mean_when_failed: float | None


def agreement(pairs: Sequence[tuple[float, float]], judged: str, verified: str, threshold: float = 0.5) -> Agreement:
    """`pairs` are (judged value, verified value) of the same trajectories."""
    n = len(pairs)
    if n == 0:
        return Agreement(judged, verified, 0, None, 0.0, None, None)
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    pearson = sum((x - mx) * (y - my) for x, y in pairs) / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else None
    same = sum(1 for x, y in pairs if (x >= threshold) == (y >= threshold))
    passed = [x for x, y in pairs if y >= threshold]
    failed = [x for x, y in pairs if y < threshold]
    return Agreement(
        judged,
        verified,
        n,
        pearson,
        same / n,
        sum(passed) / len(passed) if passed else None,
        sum(failed) / len(failed) if failed else None,
    )
