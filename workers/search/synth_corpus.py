"""The corpus as task synthesis reads it (docs/methods.md section 3): text normalisation for the verbatim-quote
checks, and `SynthCorpus`, the corpus indexed for generation (named entities, the mentions that bridge documents,
quotable sentences, IDF, BM25 over chunks). The deep generator (`workers.search.synth`) and the wide one
(`workers.search.wide`) both build on it."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workers.rewards.terms import normalize_answer
from workers.search.types import Chunk

# Quotes in template clues are wrapped in typographic quotes, so code can find them again in a clue unambiguously.
OPEN_QUOTE, CLOSE_QUOTE = "\u201c", "\u201d"
QUOTE_MIN_WORDS = 6
QUOTE_MAX_WORDS = 20

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
_HEADING_LINE = re.compile(r"^#{1,6}[ \t].*$", re.MULTILINE)
_EDGE_PUNCTUATION = "-*>#|:;,=+ \t\n"


def quotable_sentences(text: str) -> list[str]:
    """Quotable spans of `text`, in order: each sentence cut to its first `QUOTE_MAX_WORDS` words, list markers and
    dangling punctuation trimmed at both ends (trimming the ends of a substring leaves a substring), kept when it has
    `QUOTE_MIN_WORDS` words, three of them words of four letters or more, and no typographic quote mark."""
    out: list[str] = []
    # A heading names its section (`## os.path.join(a, *p)`): quoting it would hand over a name, so headings only
    # separate sentences.
    text = _HEADING_LINE.sub("\n\n", text)
    for sentence in _SENTENCE_SPLIT.split(text):
        quote = " ".join(sentence.split()[:QUOTE_MAX_WORDS]).strip(_EDGE_PUNCTUATION)
        words = quote.split()
        if len(words) < QUOTE_MIN_WORDS or OPEN_QUOTE in quote or CLOSE_QUOTE in quote:
            continue
        if sum(1 for w in words if len(w) >= 4 and w.isalpha()) < 3:
            continue
        out.append(quote)
    return out


# --- normalisation ---------------------------------------------------------------------------------------------
def normalize(text: str) -> str:
    """docs/methods.md section 3: lowercase, whitespace collapsed to single spaces (the verbatim-quote comparison)."""
    return " ".join(text.lower().split())


def _spaced(text: str) -> str:
    return " ".join(re.sub(r"[\W_]+", " ", text.lower()).split())


def contains_answer_any_form(text: str, answer: str) -> bool:
    """True when `text` holds `answer` verbatim after normalisation, or with punctuation dropped or turned into
    spaces (`os.path.join` matches `os path join` and `ospathjoin`): a distractor must not hold it in any form."""
    if not answer.strip():
        return False
    if normalize(answer) in normalize(text):
        return True
    spaced = _spaced(answer)
    if spaced and f" {spaced} " in f" {_spaced(text)} ":
        return True
    squad = normalize_answer(answer)
    return bool(squad) and squad in normalize_answer(text)


def mentions_name(text: str, name: str) -> bool:
    """True when `text` holds `name` as a whole word (after normalisation, or with punctuation as spaces): the
    leak test for questions and quotes, where `copy` inside `copying` gives nothing away."""
    needle = normalize(name)
    if not needle:
        return False
    if re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", normalize(text)):
        return True
    spaced = _spaced(name)
    return bool(spaced) and f" {spaced} " in f" {_spaced(text)} "


# --- the corpus, indexed for generation ------------------------------------------------------------------------
_NAME = re.compile(r"(?<![\w.])([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)")
WORD_PATTERN = re.compile(r"\w\w+")


def _identifier_like(token: str) -> bool:
    """A name that prose would not produce by accident: dotted, snake_case, with digits, or CamelCase."""
    body = token.strip("_")
    if "." in body or "_" in body or any(ch.isdigit() for ch in body):
        return True
    return any(ch.isupper() for ch in body[1:]) and any(ch.islower() for ch in body)


# A Markdown heading that defines a code name: `## os.path.join(a, *p)`, `## class ValueError(...)`,
# `### Path.stem (property)`. A heading of prose (`## Boolean operations`) defines nothing.
_HEADING_NAME = re.compile(
    r"^#{1,6}[ \t]+(?:class[ \t]+|(?:async[ \t]+)?def[ \t]+)?([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
    r"(\(|[ \t]*$|[ \t]+\(property\))",
    re.MULTILINE,
)
# A title that is a code name, alone or before a colon: `os.path`, `os.path: Common pathname manipulations.`
_TITLE_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?::|$)")


@dataclass(frozen=True)
class Entity:
    """What a name refers to: a document (`chunk` None: named by its title) or one chunk of it (named by a heading
    in that chunk, as one API item of a module's documentation is)."""

    doc_id: str
    chunk: int | None = None


@dataclass(frozen=True)
class Mention:
    """A name written in a chunk (`surface`, exactly as written) and the entity it refers to, in another document."""

    surface: str
    target: Entity

    @property
    def doc_id(self) -> str:
        return self.target.doc_id


class SynthCorpus:
    """The corpus with what generation needs: named entities, the mentions that bridge documents, quotable
    sentences, IDF, and BM25 over chunks.

    Names come from document titles (a title that is a code name, alone or before a colon, names its document) and
    from headings inside chunks (`## os.path.join(a, *p)` names that chunk). A name's last dotted component is a name
    too when nothing else uses it. A name given to two entities names neither. A token in a chunk counts as a mention
    when it is such a name and reads like code: identifier-like (`_identifier_like`), the start of a dotted name,
    written as a call (`copystat(`) or in backticks; plain words that happen to be titles (`string`) are not.
    Only mentions of other documents are kept: a bridge always crosses documents.
    """

    def __init__(self, chunks: Sequence[Chunk]) -> None:
        if not chunks:
            raise ValueError("the corpus has no chunks: import documents into the corpus dataset first")
        self.chunks: list[Chunk] = list(chunks)
        self.index_of: dict[str, int] = {}
        for i, chunk in enumerate(self.chunks):
            if chunk.chunk_id in self.index_of:
                raise ValueError(f"chunk id {chunk.chunk_id!r} appears twice in the corpus")
            self.index_of[chunk.chunk_id] = i
        self.normalized: list[str] = [normalize(c.text) for c in self.chunks]
        self.doc_chunks: dict[str, list[int]] = {}
        for i, chunk in enumerate(self.chunks):
            self.doc_chunks.setdefault(chunk.doc_id, []).append(i)
        for members in self.doc_chunks.values():
            members.sort(key=lambda i: self.chunks[i].position)
        self.names: dict[str, Entity] = self._build_names()
        self.entity_names: dict[Entity, str] = {}
        for name, entity in self.names.items():
            # The longest name of an entity is its full name (`shutil.copyfileobj`, not `copyfileobj`).
            if len(name) > len(self.entity_names.get(entity, "")):
                self.entity_names[entity] = name
        self.mentions: list[tuple[Mention, ...]] = [self._find_mentions(c) for c in self.chunks]
        self.mention_count: Counter[Entity] = Counter(m.target for ms in self.mentions for m in ms)
        # An entity mentioned by more than 1% of the chunks (`ValueError`) is a hub: tasks prefer rarer bridges so
        # that answers do not pile up on a few names.
        self.hub_limit = max(10, len(self.chunks) // 100)
        sentences = [quotable_sentences(c.text) for c in self.chunks]
        # A sentence repeated verbatim elsewhere (an alias documented twice, an inherited docstring) cannot single
        # out its chunk; counting whole sentences finds most repeats in one pass, `quote_is_unique` the rest.
        self.sentence_count: Counter[str] = Counter(normalize(q) for qs in sentences for q in qs)
        self.quotable: list[bool] = [any(self.sentence_count[normalize(q)] == 1 for q in qs) for qs in sentences]
        self.doc_quotable: dict[str, bool] = {
            doc: any(self.quotable[i] for i in members) for doc, members in self.doc_chunks.items()
        }
        document_frequency: Counter[str] = Counter()
        for text in self.normalized:
            document_frequency.update(set(WORD_PATTERN.findall(text)))
        total = len(self.chunks)
        self.idf: dict[str, float] = {w: math.log(total / df) for w, df in document_frequency.items()}
        self._bm25: Any = None

    def chunk(self, chunk_id: str) -> Chunk:
        return self.chunks[self.index_of[chunk_id]]

    def _build_names(self) -> dict[str, Entity]:
        full: dict[str, set[Entity]] = {}
        for doc, members in self.doc_chunks.items():
            # Only a real title names a document: a doc id (`py:os.path`) is an address, not a name.
            match = _TITLE_NAME.match(self.chunks[members[0]].title.strip())
            if match:
                full.setdefault(match.group(1), set()).add(Entity(doc))
        for i, chunk in enumerate(self.chunks):
            for match in _HEADING_NAME.finditer(chunk.text):
                full.setdefault(match.group(1), set()).add(Entity(chunk.doc_id, i))
        names = {name: next(iter(e)) for name, e in full.items() if len(e) == 1 and len(name) >= 3}
        tails: dict[str, set[Entity]] = {}
        for name, entities in full.items():
            if "." in name:
                tails.setdefault(name.rsplit(".", 1)[1], set()).update(entities)
        for tail, entities in tails.items():
            # A last component shared by two entities, or equal to another full name, names nothing for sure.
            if len(entities) == 1 and tail not in full and len(tail) >= 3:
                names[tail] = next(iter(entities))
        return names

    def _find_mentions(self, chunk: Chunk) -> tuple[Mention, ...]:
        found: dict[str, Mention] = {}
        text = chunk.text
        for match in _NAME.finditer(text):
            token = match.group(1)
            before = text[match.start() - 1] if match.start() > 0 else ""
            after = text[match.end()] if match.end() < len(text) else ""
            code_like = after == "(" or (before == "`" and after == "`")
            # The longest dotted prefix that is a name: `os.path.join` mentions `os.path` when only that is one.
            parts = token.split(".")
            for cut in range(len(parts), 0, -1):
                surface = ".".join(parts[:cut])
                entity = self.names.get(surface)
                if entity is None:
                    continue
                prefix = cut < len(parts)
                if (_identifier_like(surface) or code_like or prefix) and entity.doc_id != chunk.doc_id:
                    found.setdefault(surface, Mention(surface=surface, target=entity))
                break
        return tuple(found.values())

    # BM25 is built on first use: gathering and verification do not need it.
    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """Top-`k` chunks (index, BM25 score > 0) for each query, best first."""
        import bm25s

        if self._bm25 is None:
            tokens = bm25s.tokenize([c.text for c in self.chunks], stopwords="en", show_progress=False)
            retriever = bm25s.BM25()
            retriever.index(tokens, show_progress=False)
            self._bm25 = retriever
        if not queries:
            return []
        k = max(1, min(k, len(self.chunks)))
        query_tokens = bm25s.tokenize(list(queries), stopwords="en", show_progress=False, return_ids=False)
        docs, scores = self._bm25.retrieve(query_tokens, k=k, show_progress=False)
        out: list[list[tuple[int, float]]] = []
        for row_docs, row_scores in zip(docs, scores, strict=True):
            out.append([(int(d), float(s)) for d, s in zip(row_docs, row_scores, strict=True) if float(s) > 0.0])
        return out

    def chain_depths(self, max_hops: int) -> list[int]:
        """For each chunk, the most bridges (up to `max_hops`) a chain starting there can cross to chunks with a
        sentence to quote, computed without the rule that a chain never revisits a document: an upper bound that
        steers seeds, not a promise."""
        depths = [0] * len(self.chunks)
        for _ in range(max_hops):
            doc_best = {doc: max(depths[i] for i in members) for doc, members in self.doc_chunks.items()}

            def reach(mention: Mention, depths: list[int] = depths, doc_best: dict[str, int] = doc_best) -> int:
                chunk = mention.target.chunk
                if chunk is not None:
                    return 1 + depths[chunk] if self.quotable[chunk] else 0
                return 1 + doc_best[mention.doc_id] if self.doc_quotable[mention.doc_id] else 0

            depths = [min(max_hops, max((reach(m) for m in ms), default=0)) for ms in self.mentions]
        return depths

    def quote_is_unique(self, quote: str, source: int) -> bool:
        """True when the normalised quote occurs in chunk `source` and in no other chunk. Any chunk holding the quote
        holds all its words, so it ranks near the top of a BM25 search for it: checking the top hits suffices."""
        needle = normalize(quote)
        if needle not in self.normalized[source]:
            return False
        hits = self.search([quote], k=10)[0]
        holders = {i for i, _ in hits if needle in self.normalized[i]}
        return holders == {source}


def task_id_for(question: str, answer: str, gold: Sequence[str]) -> str:
    digest = hashlib.sha256(json.dumps([question, answer, list(gold)]).encode()).hexdigest()
    return f"synth-{digest[:16]}"
