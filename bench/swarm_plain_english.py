"""The scripted swarm teacher on wide tasks in plain English over a corpus it was not built for (issue 40 part 2).

    .venv/bin/python bench/swarm_plain_english.py [--tasks 40] [--quick] [--refresh]

The corpus: 700 Debian package records (`/var/lib/dpkg/status` of this machine's Debian 12 image, frozen into
`bench/data/debian_packages.jsonl.gz` so every machine reads the same; `--refresh` rebuilds it), a documentation
set no part of Crucible was written or tuned against. Two renderings of it, each its own corpus and index:
- `control`: each package's record as Debian ships it (`Package: curl`, `Version: ...`, `Maintainer: ...`, the
  description's paragraphs), status fields dropped;
- `prose`: the same facts written as sentences, each field in one of three phrasings chosen by the package name's
  hash, some of which the extractor cannot read by design ("Alessandro Ghedini looks after it": the value comes
  before any word of the column), so this rendering measures how much plain prose the reading covers.

The tasks (`--tasks` per corpus, seeded), asked as a person would ask, in six phrasings: 3-6 packages by name and
2-3 of version, section, priority, maintainer, architecture, homepage, the question naming both ("For each of these
4 packages: curl, wget, rsync and tar, give the version and the section."); and one in four an enumeration ("Build
a table of every package maintained by "Debian Python Team <...>", with its version.", a maintainer with 2-6
packages). The gold table comes from the records; its key column is `package`. Each task is a row of the `swarm`
environment (`table`, no chunk gold: scored by the table alone) and is played by the scripted orchestrator alone
(`single`) and with scripted sub-agents (`swarm`, threads), scored by WideSearch's rules (docs/wide-table-scoring.md).

Reported per corpus and mode: mean item-F1 (the done-when figure, > 0.5), the share of tasks at item-F1 >= 0.5,
row-F1 (whole rows right), and the same split by listed / enumerated tasks. Results:
bench/results/swarm_plain_english.{txt,json}.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATA = ROOT / "bench" / "data" / "debian_packages.jsonl.gz"
FIELDS = {
    "Package": "package",
    "Version": "version",
    "Section": "section",
    "Priority": "priority",
    "Maintainer": "maintainer",
    "Architecture": "architecture",
    "Homepage": "homepage",
    "Installed-Size": "installed_size",
    "Depends": "depends",
    "Description": "description",
}
COLUMNS = ["version", "section", "priority", "maintainer", "architecture", "homepage"]
PHRASINGS = [
    "For each of these {n} packages: {items}, give the {columns}.",
    "What are the {columns} of {items}?",
    "I need a table of the following packages with their {columns}:\n{bullets}",
    "Look up {items} and tell me the {columns} of each.",
    "Tabulate the {columns} for {items}.",
    "Please compare {items}: for each one list the {columns}.",
]
ENUMERATION = ['Build a table of every package maintained by "{maintainer}", with its {columns}.']
HELD_OUT_PHRASINGS = [
    "Can you find the {columns} for the packages {items}?",
    "{items}: I want to know the {columns} of each.",
    "Make a table with the {columns} of these packages: {items}.",
    "Show {columns} for:\n{bullets}",
    "Give me, for {items}, their {columns}.",
    "Which {columns} do {items} have?",
]
"""Written after the reading was tuned on PHRASINGS, and never used to change it: `--phrasings held-out`."""
HELD_OUT_ENUMERATION = [
    'List all packages whose maintainer is "{maintainer}", with their {columns}.',
    'Every package that "{maintainer}" maintains: give its {columns}.',
]
PROSE = {
    "version": ["The packaged version is {v}.", "Its current version is {v}.", "Debian ships version {v} of it."],
    "section": ["It is filed under the {v} section.", "Its section is {v}.", "Debian lists it in section {v}."],
    "priority": ["Its priority is {v}.", "It has the priority {v}.", "The archive gives it {v} priority."],
    "maintainer": ["It is maintained by {v}.", "Its maintainer is {v}.", "{v} looks after it."],
    "architecture": ["It is built for the {v} architecture.", "Architecture: {v}.", "It runs on {v} machines."],
    "homepage": ["Its homepage is {v}.", "The upstream homepage is {v}.", "More is at {v} upstream."],
}


def parse_status(text: str) -> list[dict[str, str]]:
    records: list[dict[str, str]] = []
    for stanza in text.split("\n\n"):
        record: dict[str, str] = {}
        field = None
        for line in stanza.splitlines():
            if line.startswith((" ", "\t")) and field == "description":
                body = line.strip()
                record["long"] = record.get("long", "") + ("\n" if body == "." else " " + body)
                continue
            name, _, value = line.partition(":")
            field = FIELDS.get(name)
            if field:
                record[field] = value.strip()
        if record.get("package") and record.get("version") and record.get("description"):
            record["long"] = record.get("long", "").strip()[:700]
            records.append(record)
    return records


def load_records(refresh: bool) -> list[dict[str, str]]:
    if refresh or not DATA.exists():
        records = sorted(parse_status(Path("/var/lib/dpkg/status").read_text()), key=lambda r: r["package"])[:700]
        DATA.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(DATA, "wt") as out:
            for record in records:
                out.write(json.dumps(record, sort_keys=True) + "\n")
    with gzip.open(DATA, "rt") as lines:
        return [json.loads(line) for line in lines]


def control_text(record: dict[str, str]) -> str:
    names = {v: k for k, v in FIELDS.items()}
    lines = [f"{names[f]}: {record[f]}" for f in ("package", *COLUMNS, "installed_size", "depends") if f in record]
    lines.append(f"Description: {record['description']}")
    lines += [" " + paragraph for paragraph in record.get("long", "").split("\n") if paragraph.strip()]
    return "\n".join(lines)


def prose_text(record: dict[str, str]) -> str:
    pick = int(hashlib.sha1(record["package"].encode()).hexdigest(), 16)
    sentences = [f"{record['package']}: {record['description']}."]
    for i, column in enumerate(COLUMNS):
        if column in record:
            sentences.append(PROSE[column][(pick >> (2 * i)) % 3].format(v=record[column]))
    return " ".join(sentences) + "\n\n" + record.get("long", "")


def english_list(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def make_tasks(records: list[dict[str, str]], count: int, seed: int, *, held_out: bool = False) -> list[dict[str, Any]]:
    phrasings, enumerations = (HELD_OUT_PHRASINGS, HELD_OUT_ENUMERATION) if held_out else (PHRASINGS, ENUMERATION)
    rng = random.Random(seed)
    by_maintainer: dict[str, list[dict[str, str]]] = defaultdict(list)
    for record in records:
        by_maintainer[record.get("maintainer", "")].append(record)
    small = sorted(m for m, rs in by_maintainer.items() if m and 2 <= len(rs) <= 6)
    tasks: list[dict[str, Any]] = []
    for i in range(count):
        enumerate_ = i % 4 == 3 and small
        columns = rng.sample(COLUMNS, rng.randint(2, 3))
        if enumerate_:
            maintainer = small[rng.randrange(len(small))]
            columns = [c for c in columns if c != "maintainer"] or ["version"]
            picked = by_maintainer[maintainer]
            prompt = enumerations[i % len(enumerations)].format(maintainer=maintainer, columns=english_list(columns))
            kind = "enumerated"
        else:
            candidates = [r for r in records if all(c in r for c in columns)]
            picked = rng.sample(candidates, rng.randint(3, 6))
            names = [r["package"] for r in picked]
            phrasing = phrasings[i % len(phrasings)]
            prompt = phrasing.format(
                n=len(names),
                items=english_list(names),
                columns=english_list([c.replace("_", " ") for c in columns]),
                bullets="\n".join(f"- {n}" for n in names),
            )
            kind = "listed"
        rows = [{"package": r["package"], **{c: r[c] for c in columns}} for r in picked]
        tasks.append(
            {
                "id": f"deb-{kind}-{i}",
                "prompt": prompt,
                "task_kind": "wide",
                "kind": kind,
                "table": {"columns": ["package", *columns], "key_columns": ["package"], "rows": rows},
            }
        )
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=40, help="tasks per corpus")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="8 tasks per corpus")
    parser.add_argument("--refresh", action="store_true", help="rebuild the frozen records from /var/lib/dpkg/status")
    parser.add_argument(
        "--phrasings",
        choices=["tuned", "held-out"],
        default="tuned",
        help="the six phrasings the reading was developed on, or six written afterwards and never tuned on",
    )
    parser.add_argument("--out", default="", help="results path without suffix (default by --phrasings)")
    args = parser.parse_args()
    count = 8 if args.quick else args.tasks

    from workers.envs.registry import make_env
    from workers.search.corpus import Document, build_corpus
    from workers.search.index import IndexConfig, SearchIndex
    from workers.search.index_store import save_index
    from workers.swarm.metrics import swarm_episode_metrics
    from workers.swarm.scripted import ScriptedOrchestrator, run_episode

    started = time.perf_counter()
    records = load_records(args.refresh)
    tasks = make_tasks(records, count, args.seed, held_out=args.phrasings == "held-out")
    suffix = "-held-out" if args.phrasings != "tuned" else ""
    out = args.out or str(ROOT / "bench" / "results" / f"swarm_plain_english{suffix}")
    tmp = Path(tempfile.mkdtemp(prefix="crucible-plain-english-"))
    os.environ["CRUCIBLE_INDEX_CACHE"] = str(tmp / "cache")
    results: dict[str, Any] = {"records": len(records), "tasks_per_corpus": len(tasks), "corpora": {}}
    lines = [
        f"Scripted swarm teacher on plain-English wide tasks (issue 40 part 2): {len(records)} Debian package "
        f"records, {len(tasks)} tasks per corpus ({args.phrasings} phrasings), seed {args.seed}; "
        f"load average {os.getloadavg()[0]:.2f}",
        "",
        "| corpus | mode | item-F1 (mean) | tasks at item-F1 >= 0.5 | row-F1 | listed item-F1 | enumerated item-F1 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    examples: list[dict[str, Any]] = []
    for corpus_name, render in (("control", control_text), ("prose", prose_text)):
        documents = [Document(doc_id=r["package"], text=render(r), title=r["package"]) for r in records]
        chunks, _ = build_corpus(documents)
        index = SearchIndex.build(chunks, IndexConfig(dense=False))
        uri = f"file://{tmp}/{corpus_name}"
        save_index(index, uri)
        per_mode: dict[str, Any] = {}
        for mode in ("single", "swarm"):
            rows: list[dict[str, Any]] = []
            for task in tasks:
                env = make_env("swarm", index_uri=uri, subagent_runner="threads")
                env.bind_index(index)
                record = run_episode(env, ScriptedOrchestrator(mode), task)
                metrics = swarm_episode_metrics(record)
                rows.append({"id": task["id"], "kind": task["kind"], **metrics})
                if len(examples) < 4 and mode == "swarm" and corpus_name == "control":
                    examples.append({"prompt": task["prompt"], "answer": record.get("answer")})
            figures = {
                "item_f1": statistics.mean(r["item_f1"] for r in rows),
                "at_half": sum(r["item_f1"] >= 0.5 for r in rows) / len(rows),
                "row_f1": statistics.mean(r.get("row_f1", 0.0) for r in rows),
                **{
                    f"{kind}_item_f1": statistics.mean(r["item_f1"] for r in rows if r["kind"] == kind)
                    for kind in ("listed", "enumerated")
                    if any(r["kind"] == kind for r in rows)
                },
                "tasks": rows,
            }
            per_mode[mode] = figures
            lines.append(
                f"| {corpus_name} ({len(chunks)} chunks) | {mode} | {figures['item_f1']:.3f} "
                f"| {figures['at_half']:.2f} | {figures['row_f1']:.3f} "
                f"| {figures.get('listed_item_f1', float('nan')):.3f} "
                f"| {figures.get('enumerated_item_f1', float('nan')):.3f} |"
            )
        results["corpora"][corpus_name] = per_mode
    results["seconds"] = time.perf_counter() - started
    results["examples"] = examples
    lines += ["", f"{results['seconds']:.0f} s in all.", "", "Example answers (control corpus, swarm):"]
    for example in examples:
        lines += ["", "> " + example["prompt"].replace("\n", "\n> "), "", str(example["answer"])]
    text = "\n".join(lines)
    print(text)
    if not args.quick:
        Path(out + ".txt").write_text(text + "\n")
        Path(out + ".json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
