"""The coding_agent harness on a small real task: hidden-test run time, scripted episodes per minute, tool overhead.

    python bench/coding_episodes.py [--hidden-runs 40] [--episodes 16] [--overhead-runs 200]

The task is written below: `textkit`, a small text-utilities package (case conversion, slugs, wrapping; about 150
lines and two visible test files) with one bug (`slugify` cuts one character short of `max_length`), hidden tests
with 1 fail-to-pass and 5 pass-to-pass tests, and its reference patch. Everything runs in the real sandbox
(workers.sandbox: namespaces, Landlock, rlimits, a uid of its own per command).

1. Hidden tests: `workers.coding.hidden_tests.run_hidden_tests` on the solved workspace, `--hidden-runs` times, one
   after another (as the environment runs them after each episode): p50, p95 and mean seconds.
2. Episode throughput: the scripted coding agent (workers/coding/scripted.py) solving the task through the real
   tools: list_files, read_file, edit_file, run (the visible tests in the sandbox), finish, then the hidden tests.
   `--episodes` episodes in 1 process, then the same number split over 2 processes (the machine's 2 cores):
   episodes per minute = episodes / wall seconds x 60. Every episode must end resolved.
3. Tool-call overhead: the harness's `read_file` and `edit_file` (path checks, line numbering, bounds, the
   observation text) against the raw workspace operation, and its `run` against `execute.run_command` alone:
   medians over `--overhead-runs` calls (run: a tenth of that).

The machine may be busy with other work: the load average is printed beside the figures. Results:
bench/results/coding_episodes.{txt,json}. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._noise import add_load_guard, load_guard  # noqa: E402
from workers.coding.environment import CodingAgentEnv  # noqa: E402
from workers.coding.execute import CommandLimits, run_command  # noqa: E402
from workers.coding.hidden_tests import run_hidden_tests  # noqa: E402
from workers.coding.patches import apply_patch, make_patch  # noqa: E402
from workers.coding.scripted import ScriptedCodingAgent, run_episode  # noqa: E402
from workers.coding.task import HiddenTests  # noqa: E402
from workers.coding.workspace import Snapshot, Workspace  # noqa: E402
from workers.envs.registry import make_env  # noqa: E402
from workers.envs.toolcalls import ToolCall  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

CASE = '''"""Case conversions."""

import re

_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\\d+")


def words(text):
    """The words of `text`, whatever its case or separators."""
    return _WORD.findall(text)


def snake_case(text):
    return "_".join(word.lower() for word in words(text))


def kebab_case(text):
    return "-".join(word.lower() for word in words(text))


def camel_case(text):
    parts = words(text)
    if not parts:
        return ""
    return parts[0].lower() + "".join(word.capitalize() for word in parts[1:])


def pascal_case(text):
    return "".join(word.capitalize() for word in words(text))


def title_case(text, small=("a", "an", "the", "of", "and", "or", "in")):
    out = []
    for index, word in enumerate(words(text)):
        lower = word.lower()
        out.append(lower if index and lower in small else word.capitalize())
    return " ".join(out)
'''

SLUG = '''"""URL slugs."""

import unicodedata

from textkit.case import words


def ascii_fold(text):
    """`text` without accents: "café" -> "cafe"."""
    normal = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in normal if not unicodedata.combining(ch))


def slugify(text, separator="-", max_length=None):
    """A lower-case, ASCII, separator-joined slug of `text`, at most `max_length` characters (whole words)."""
    parts = [word.lower() for word in words(ascii_fold(text))]
    slug = separator.join(parts)
    if max_length is None or len(slug) <= max_length:
        return slug
    kept = []
    size = 0
    for part in parts:
        extra = len(part) + (len(separator) if kept else 0)
        if size + extra >= max_length:
            break
        kept.append(part)
        size += extra
    return separator.join(kept)


def unique_slug(text, taken, separator="-"):
    base = slugify(text, separator)
    slug, number = base, 2
    while slug in taken:
        slug = f"{base}{separator}{number}"
        number += 1
    return slug
'''

WRAP = '''"""Text wrapping."""


def wrap(text, width=70):
    """Lines of at most `width` characters, breaking between words (a longer word gets a line of its own)."""
    lines, current = [], ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def indent(text, prefix="    "):
    return "\\n".join(prefix + line if line.strip() else line for line in text.splitlines())


def dedent_common(text):
    lines = text.splitlines()
    margins = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    cut = min(margins) if margins else 0
    return "\\n".join(line[cut:] for line in lines)
'''

REPO = {
    "README.md": "# textkit\n\nSmall text utilities: case conversion, slugs and wrapping.\n",
    "textkit/__init__.py": '"""textkit."""\n\n__version__ = "0.3.1"\n',
    "textkit/case.py": CASE,
    "textkit/slug.py": SLUG,
    "textkit/wrap.py": WRAP,
    "tests/test_case.py": "from textkit.case import camel_case, snake_case\n\n\ndef test_snake():\n"
    '    assert snake_case("HTTPServerError") == "http_server_error"\n\n\ndef test_camel():\n'
    '    assert camel_case("make it so") == "makeItSo"\n',
    "tests/test_slug.py": "from textkit.slug import slugify, unique_slug\n\n\ndef test_slugify():\n"
    '    assert slugify("Café au lait!") == "cafe-au-lait"\n\n\ndef test_unique():\n'
    '    assert unique_slug("a b", {"a-b", "a-b-2"}) == "a-b-3"\n',
    "tests/test_wrap.py": "from textkit.wrap import wrap\n\n\ndef test_wrap():\n"
    '    assert wrap("a bb ccc dddd", 6) == ["a bb", "ccc", "dddd"]\n',
}
FIXED_SLUG = SLUG.replace("if size + extra >= max_length:", "if size + extra > max_length:")
HIDDEN = {
    "files": {
        "tests/test_hidden_slug.py": "from textkit.case import kebab_case, title_case\n"
        "from textkit.slug import slugify\nfrom textkit.wrap import indent, wrap\n\n\n"
        "def test_max_length_is_inclusive():\n"
        '    assert slugify("one two three", max_length=7) == "one-two"\n\n\n'
        "def test_max_length_keeps_whole_words():\n"
        '    assert slugify("one two three", max_length=9) == "one-two"\n\n\n'
        "def test_kebab():\n"
        '    assert kebab_case("XMLHttpRequest") == "xml-http-request"\n\n\n'
        "def test_title():\n"
        '    assert title_case("the lord of the rings") == "The Lord of the Rings"\n\n\n'
        "def test_wrap_long_word():\n"
        '    assert wrap("a verylongword b", 5) == ["a", "verylongword", "b"]\n\n\n'
        "def test_indent():\n"
        '    assert indent("x\\n\\ny") == "    x\\n\\n    y"\n'
    },
    "fail_to_pass": ["tests/test_hidden_slug.py::test_max_length_is_inclusive"],
    "pass_to_pass": [
        "tests/test_hidden_slug.py::test_max_length_keeps_whole_words",
        "tests/test_hidden_slug.py::test_kebab",
        "tests/test_hidden_slug.py::test_title",
        "tests/test_hidden_slug.py::test_wrap_long_word",
        "tests/test_hidden_slug.py::test_indent",
    ],
}
ROW = {
    "id": "textkit-slug-max-length",
    "prompt": "slugify(max_length=...) returns slugs shorter than it should. Fix it.",
    "answer": None,
    "repo": {"files": REPO},
    "hidden_tests": HIDDEN,
    "reference_patch": make_patch({"textkit/slug.py": SLUG}, {"textkit/slug.py": FIXED_SLUG}),
}
ENV_PARAMS = {"summary_threshold_tokens": 0}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _episode(_: int) -> tuple[float, bool, int]:
    started = time.perf_counter()
    env = make_env("coding_agent", **ENV_PARAMS)
    env.reset(env.validate_task_row(ROW))
    record = run_episode(env, ScriptedCodingAgent.for_row(ROW))
    return time.perf_counter() - started, bool(record["hidden_tests"]["resolved"]), int(record["counts"]["turns"])


def _throughput(episodes: int, processes: int) -> dict[str, Any]:
    started = time.perf_counter()
    if processes == 1:
        results = [_episode(i) for i in range(episodes)]
    else:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            results = pool.map(_episode, range(episodes), chunksize=1)
    wall = time.perf_counter() - started
    seconds = [r[0] for r in results]
    return {
        "processes": processes,
        "episodes": episodes,
        "resolved": sum(r[1] for r in results),
        "turns_per_episode": statistics.fmean(r[2] for r in results),
        "wall_seconds": round(wall, 2),
        "episodes_per_minute": round(episodes / wall * 60, 1),
        "episode_seconds_p50": round(statistics.median(seconds), 3),
    }


def _median_us(fn: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def _overhead(runs: int) -> dict[str, Any]:
    env = make_env("coding_agent", **ENV_PARAMS)
    assert isinstance(env, CodingAgentEnv)
    env.reset(env.validate_task_row(ROW))
    raw = Workspace(Snapshot.from_files(REPO))
    read_call = ToolCall("read_file", {"path": "textkit/slug.py"})
    search, replace = "if size + extra >= max_length:", "if size + extra > max_length:"
    edits = [
        ToolCall("edit_file", {"path": "textkit/slug.py", "search": a, "replace": b})
        for a, b in ((search, replace), (replace, search))
    ]
    state = {"i": 0}

    def harness_edit() -> None:
        env.run_tool(edits[state["i"] % 2])
        state["i"] += 1

    def raw_edit() -> None:
        a, b = ((search, replace), (replace, search))[state["i"] % 2]
        text = raw.read_text("textkit/slug.py")
        raw.write_text("textkit/slug.py", text.replace(a, b, 1))
        state["i"] += 1

    figures = {
        "read_file_harness_us": _median_us(lambda: env.run_tool(read_call), runs),
        "read_file_raw_us": _median_us(lambda: raw.read_text("textkit/slug.py"), runs),
        "edit_file_harness_us": _median_us(harness_edit, runs),
        "edit_file_raw_us": _median_us(raw_edit, runs),
    }
    command = "python -m pytest -q -p no:cacheprovider tests/test_slug.py"
    run_call = ToolCall("run", {"command": command})
    limits = CommandLimits(max_output_chars=env.max_output_chars)
    run_runs = max(3, runs // 10)
    figures["run_harness_ms"] = _median_us(lambda: env.run_tool(run_call), run_runs) / 1000
    figures["run_raw_ms"] = _median_us(lambda: run_command(raw, command, limits=limits), run_runs) / 1000
    return {key: round(value, 1) for key, value in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-runs", type=int, default=40)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--overhead-runs", type=int, default=200)
    add_load_guard(parser)
    args = parser.parse_args()
    load_guard(args)

    load_before = os.getloadavg()
    solved = Workspace(Snapshot.from_files(REPO))
    apply_patch(solved, str(ROW["reference_patch"]))
    hidden = HiddenTests.model_validate(HIDDEN)
    run_hidden_tests(solved, hidden)  # warm the page cache and the interpreter's imports once
    seconds = []
    for _ in range(args.hidden_runs):
        report = run_hidden_tests(solved, hidden)
        assert report.resolved, report
        seconds.append(report.seconds)
    hidden_figures = {
        "runs": args.hidden_runs,
        "p50_seconds": round(statistics.median(seconds), 3),
        "p95_seconds": round(_percentile(seconds, 0.95), 3),
        "mean_seconds": round(statistics.fmean(seconds), 3),
    }
    one = _throughput(args.episodes, 1)
    two = _throughput(args.episodes, 2)
    for result in (one, two):
        assert result["resolved"] == result["episodes"], result
    overhead = _overhead(args.overhead_runs)
    load_after = os.getloadavg()

    figures = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "task": f"{ROW['id']}: {len(REPO)} files, hidden tests 1 fail-to-pass + 5 pass-to-pass",
        "hidden_tests": hidden_figures,
        "throughput": [one, two],
        "tool_overhead": overhead,
    }
    lines = [
        "coding_agent on a small real task (bench/coding_episodes.py)",
        f"machine: {figures['machine']}; load average before {figures['load_average_before']}, "
        f"after {figures['load_average_after']}",
        f"task: {figures['task']}",
        "",
        f"hidden-test run ({args.hidden_runs} runs, sandboxed pytest on a fork of the solved workspace): "
        f"p50 {hidden_figures['p50_seconds']:.3f} s, p95 {hidden_figures['p95_seconds']:.3f} s, "
        f"mean {hidden_figures['mean_seconds']:.3f} s",
        "",
        "scripted-agent episodes (list, read, edit, run visible tests, finish, hidden tests; all resolved):",
    ]
    for result in (one, two):
        lines.append(
            f"  {result['processes']} process(es): {result['episodes']} episodes in {result['wall_seconds']:.1f} s = "
            f"{result['episodes_per_minute']:.1f} episodes/min (p50 {result['episode_seconds_p50']:.2f} s per "
            f"episode, {result['turns_per_episode']:.0f} replies each)"
        )
    lines += [
        "",
        "tool-call overhead, median (harness vs the raw workspace / execute operation):",
        f"  read_file  {overhead['read_file_harness_us']:.1f} us vs read_text {overhead['read_file_raw_us']:.1f} us",
        f"  edit_file  {overhead['edit_file_harness_us']:.1f} us vs read + replace + write "
        f"{overhead['edit_file_raw_us']:.1f} us",
        f"  run        {overhead['run_harness_ms']:.1f} ms vs run_command {overhead['run_raw_ms']:.1f} ms",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "coding_episodes.txt").write_text(text)
    (RESULTS / "coding_episodes.json").write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
