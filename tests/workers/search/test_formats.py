"""Format-aware import: reStructuredText, plain text, Python source and HTML become Markdown-headed sections."""

from __future__ import annotations

import pytest

from workers.search.corpus import ChunkerConfig, CorpusError, build_corpus
from workers.search.corpus_files import document_from_file, html_to_text
from workers.search.formats import plain_text_to_markdown, python_to_markdown, rst_to_markdown
from workers.search.synth_corpus import SynthCorpus

RST = """\
=========
Reference
=========

Intro text with :func:`~os.path.join` and :ref:`the guide <guide>` and ``literal``.

.. _label:

Settings
--------

.. setting:: broker_url

    Default: ``"amqp://"``. The broker to connect to.

.. function:: connect(url, timeout=None)
    :noindex:

    Open a connection.

.. toctree::
    :maxdepth: 2

    hidden/page

Example::

    code here
"""


def test_rst_titles_objects_and_roles() -> None:
    text = rst_to_markdown(RST)
    assert text.startswith("# Reference\n")
    assert "## Settings" in text
    assert "### broker_url" in text and "### connect(url, timeout=None)" in text
    assert "`join`" in text and "the guide" in text and "`literal`" in text
    assert ":noindex:" not in text and "hidden/page" not in text and ".. _label" not in text
    assert "Example:\n" in text and "    code here" in text


def test_plain_text_headings() -> None:
    source = "Title\n=====\n\nbody\n\nDESCRIPTION\nThe tool reads files.\n\nNOT A HEADING SINCE LAST\n"
    text = plain_text_to_markdown(source)
    assert "# Title" in text and "## DESCRIPTION" in text
    assert "## NOT A HEADING" not in text


def test_python_source_keeps_docstrings_comments_and_signatures() -> None:
    source = '''"""Module doc with :class:`Thing`."""
# a module comment
import os


class Thing(Base):
    """A thing."""

    def run(self, fast: bool = False) -> None:
        """Run it."""
        # why we run
        return None

    def _quiet(self):
        return 1


def helper(x, *args, **kw):
    # only a comment
    pass
'''
    text = python_to_markdown(source, "pkg.mod")
    assert text.startswith("# pkg.mod\n\nModule doc with `Thing`.\n\na module comment")
    assert "## class pkg.mod.Thing(Base)\n\nA thing." in text
    assert "### pkg.mod.Thing.run(self, fast: bool=False)\n\nRun it.\n\nwhy we run" in text
    assert "_quiet" not in text  # nothing to say: no docstring, no comment
    assert "## pkg.mod.helper(x, *args, **kw)\n\nonly a comment" in text
    assert "import os" not in text


def test_a_python_file_is_a_titled_document_and_bad_python_is_named() -> None:
    document = document_from_file("pkg/sub/__init__.py", b'"""Sub package."""\n')
    assert document is not None and document.title == "pkg.sub"
    with pytest.raises(CorpusError, match=r"pkg/bad.py line 1: not valid Python"):
        document_from_file("pkg/bad.py", b"def (:\n")


def test_html_drops_page_furniture_and_heads_definition_terms() -> None:
    page = """<html><head><title>API</title></head><body>
    <header>Site header</header><nav>Home | Docs</nav>
    <div role="navigation">Sidebar table of contents</div>
    <h1>lxml.etree</h1>
    <dl class="py class"><dt>class lxml.etree.XSLT(xslt_input)</dt>
    <dd><p>Turn an XSL document into a function.</p></dd></dl>
    <footer>Copyright 2024</footer></body></html>"""
    title, text = html_to_text(page)
    assert title == "API"
    assert "Site header" not in text and "Home | Docs" not in text and "Sidebar" not in text
    assert "Copyright" not in text
    assert "###### class lxml.etree.XSLT(xslt_input)" in text


def test_rst_documents_become_chunks_with_named_sections_the_generator_reads() -> None:
    docs = [
        document_from_file("ref.rst", RST.encode()),
        document_from_file(
            "guide.rst", b"Guide\n=====\n\nCall `connect()` after setting `broker_url` in the config.\n"
        ),
    ]
    chunks, _ = build_corpus([d for d in docs if d is not None])
    corpus = SynthCorpus(chunks)
    assert {"broker_url", "connect"} <= set(corpus.names)


def test_boilerplate_paragraphs_are_set_apart_and_repeated_chunks_merged_and_counted() -> None:
    from workers.search.corpus import Document

    footer = "Copyright 2024 Example Corp. All rights reserved."
    docs = [
        Document(f"page{i}", f"# Page {i}\n\nTopic {i} explains {word} in detail for readers.\n\n{footer}")
        for i, word in enumerate(["sockets", "threads", "queues", "files"])
    ]
    body = " ".join(f"The scheduler assigns task number {n} to a worker when one is idle." for n in range(12))
    docs.append(Document("copy-a", body))
    docs.append(Document("copy-b", body.replace("idle.", "idle!", 1)))  # a near copy
    chunks, report = build_corpus(docs)
    # The footer is set apart from every page's text and kept once, as a chunk of its own attributed to each page.
    footers = [c for c in chunks if "Copyright" in c.text]
    assert [c.text for c in footers] == [footer] and footers[0].metadata["boilerplate"] is True
    assert footers[0].metadata["also_in"] == ["page1#1", "page2#1", "page3#1"]
    assert report["boilerplate_paragraphs"] == 1 and report["boilerplate_paragraphs_removed"] == 4
    assert report["boilerplate_chunks"] == 1
    # The near copy is in another document and differs ("idle!"): it is kept, so copy-b keeps its own text.
    assert report["near_duplicate_chunks_dropped"] == 0 and report["near_duplicates_kept_across_documents"] == 1
    assert [c.doc_id for c in chunks if c.doc_id.startswith("copy")] == ["copy-a", "copy-b"]
    docs.append(Document("copy-c", body))  # word for word copy-a's: stored once, attributed to both
    chunks, report = build_corpus(docs)
    assert [c.doc_id for c in chunks if c.doc_id.startswith("copy")] == ["copy-a", "copy-b"]
    # Two shared chunks: the footer (3 copies) and copy-a's body (1 copy).
    assert report["shared_chunks"] == 2 and report["shared_chunk_copies_merged"] == 4
    assert [c.metadata.get("also_in") for c in chunks if c.doc_id == "copy-a"] == [["copy-c#0"]]
    kept, plain = build_corpus(docs, ChunkerConfig(drop_boilerplate=False, drop_near_duplicates=False))
    assert plain["near_duplicate_chunks_dropped"] == 0 and any("Copyright" in c.text for c in kept)


def test_numbers_make_chunks_different_not_duplicates() -> None:
    from workers.search.dedup import near_duplicates

    notes = [f"Release {v} fixes the parser and the cache." for v in ("1.0", "1.1", "2.0")]
    assert near_duplicates(notes) == {}
    assert near_duplicates([notes[0], notes[0].upper()]) == {1: 0}


def test_a_chunk_keeps_the_heading_path_above_it_as_context() -> None:
    from workers.search.corpus import Document, chunk_document
    from workers.search.index import index_text

    text = "# Guide\n\n## Install\n\n" + " ".join(["Run the installer now."] * 30) + "\n\n### Linux\n\nUse apt."
    chunks = chunk_document(Document("g", text, title="Guide"), ChunkerConfig(max_words=60))
    sections = [c.metadata.get("section") for c in chunks]
    # The chunk that starts at "## Install" is under the title only (left out); the next one is inside Install.
    assert sections[0] is None and sections[1] == "Install"
    last = chunks[-1]
    assert last.text.startswith("### Linux") and last.metadata["section"] == "Install"
    assert index_text(chunks[1]).startswith("Guide\nInstall\n")
