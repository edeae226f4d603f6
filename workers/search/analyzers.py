"""How BM25 sees text: the analyzer of an index (`IndexConfig.tokenizer`, `stemmer`, `stopwords`).

Two tokenizers, both lower-casing:

- `words`: bm25s's own (scikit-learn's CountVectorizer pattern `\\b\\w\\w+\\b`): `os.path.join` is `os`, `path`,
  `join`; `--max-workers` is `max`, `workers`. Right for prose.
- `code`: technical text is full of identifiers, and a user searches for them as written. Each code-like token is
  kept whole and also split into its parts, so a query for the whole name and a query for one of its words both
  match:

      --max-workers     -> --max-workers, max, workers
      os.path.join      -> os.path.join, os, path, join
      snake_case_name   -> snake_case_name, snake, case, name
      getAttributeNS    -> getattributens, get, attribute, ns
      HTTP2Server       -> http2server, http2, server

  Whole tokens (with a `.`, `_`, `-` or a case change inside) are never stemmed and never stopwords: `with_as` stays
  `with_as`. Plain words (and the parts) are stemmed and filtered as the index says.

The stemmer is the Snowball stemmer (PyStemmer) or none. The defaults of `IndexConfig` were decided by the
retrieval harness (`bench/retrieval_eval.py`) on its tuning corpora; docs/benchmarks.md shows the table.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

import bm25s
from bm25s.stopwords import STOPWORDS_EN

Tokenizer = Literal["words", "code"]

# A flag (`-v`, `--max-workers`), a dotted or snake_case identifier, or a run of word characters.
_CODE_TOKEN = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*|[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*|\d[\w.]*")
_CAMEL = re.compile(r"[A-Z]+\d*(?=[A-Z][a-z])|[A-Z]?[a-z]+\d*|[A-Z]+\d*|\d+")
_SEPARATORS = re.compile(r"[._-]+")
_STOP = frozenset(STOPWORDS_EN)


def _parts(token: str) -> list[str]:
    """The words inside a compound token, lower-cased, in order (camelCase split too), each 2+ characters."""
    out: list[str] = []
    for piece in _SEPARATORS.split(token):
        if not piece:
            continue
        out.extend(p.lower() for p in _CAMEL.findall(piece) if len(p) >= 2)
    return out


def code_tokens(text: str, *, stopwords: bool, stem: Callable[[str], str] | None) -> list[str]:
    """The `code` tokenizer (module docstring) on one text."""
    out: list[str] = []
    for match in _CODE_TOKEN.finditer(text):
        token = match.group()
        stripped = token.strip("._-")
        compound = bool(_SEPARATORS.search(stripped)) or any(c.isupper() for c in stripped[1:])
        if token.startswith("-"):
            compound = True
            stripped = token.rstrip("._-")
        if compound:
            whole = stripped.lower()
            if len(whole) >= 2:
                out.append(whole)
            words = _parts(stripped)
            if len(words) <= 1 and words == [whole]:
                continue
        else:
            words = [stripped.lower()] if len(stripped) >= 2 else []
        for word in words:
            if stopwords and word in _STOP:
                continue
            out.append(stem(word) if stem is not None and word.isalpha() else word)
    return out


class Analyzer:
    """Text to BM25 tokens under one index's settings. Not thread-safe (PyStemmer is not): one per thread."""

    def __init__(self, tokenizer: Tokenizer, stemmer: str | None, stopwords: str | None) -> None:
        self.tokenizer = tokenizer
        self.stopwords = stopwords
        self._stemmer: Any = _stemmer(stemmer)
        self._cache: dict[str, str] = {}

    def _stem(self, word: str) -> str:
        cached = self._cache.get(word)
        if cached is None:
            cached = self._stemmer.stemWord(word)
            if len(self._cache) < 200_000:
                self._cache[word] = cached
        return cached

    def tokens(self, texts: Sequence[str]) -> list[list[str]]:
        """One token list per text."""
        if self.tokenizer == "words":
            result = bm25s.tokenize(
                list(texts),
                stopwords=self.stopwords,
                stemmer=self._stemmer,
                return_ids=False,
                show_progress=False,
            )
            return [list(tokens) for tokens in result]
        stem = self._stem if self._stemmer is not None else None
        return [code_tokens(text, stopwords=self.stopwords is not None, stem=stem) for text in texts]


def _stemmer(name: str | None) -> Any:
    if name is None:
        return None
    import Stemmer

    return Stemmer.Stemmer(name)


class AnalyzerPool:
    """One `Analyzer` per thread for a fixed configuration (an index serves every environment of an actor)."""

    def __init__(self, tokenizer: Tokenizer, stemmer: str | None, stopwords: str | None) -> None:
        self._args = (tokenizer, stemmer, stopwords)
        self._local = threading.local()

    def get(self) -> Analyzer:
        analyzer = getattr(self._local, "analyzer", None)
        if analyzer is None:
            analyzer = Analyzer(*self._args)
            self._local.analyzer = analyzer
        return analyzer
