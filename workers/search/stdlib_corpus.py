"""The built-in demo corpus: documentation that ships with every Python, so nothing is downloaded.

Two kinds of document:

- `topic:<name>`: one per pydoc topic (`pydoc_data.topics`, the language reference sections `help()` shows);
- `py:<module>`: one per module of `STDLIB_MODULES`, the module docstring followed by each public class,
  method and function docstring under a heading such as `os.path.join(a, *p)`.

The module list is fixed (not discovered), pure Python and free of import side effects, so building the corpus
never opens a window, starts a browser or prints; a module that fails to import on some build is skipped.
Sections and members are sorted, and addresses that reprs of default values carry (`<object at 0x...>`) are
removed from signatures, so the same Python gives the same corpus every time.
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings
from types import ModuleType
from typing import Any

from workers.search.corpus import Document

# Standard-library modules whose import has no side effects (no GUI, no browser, no readline hooks, no
# deprecation warnings in 3.11): pure Python, plus the few built-in modules every build has and every reader
# asks about (builtins, itertools, math, sys, time). Never add this, antigravity, idlelib, tkinter, turtle or
# turtledemo.
STDLIB_MODULES = (
    "builtins",
    "itertools",
    "math",
    "sys",
    "time",
    "abc",
    "argparse",
    "ast",
    "asyncio.base_events",
    "asyncio.events",
    "asyncio.exceptions",
    "asyncio.futures",
    "asyncio.locks",
    "asyncio.queues",
    "asyncio.runners",
    "asyncio.streams",
    "asyncio.tasks",
    "asyncio.timeouts",
    "base64",
    "bdb",
    "bisect",
    "bz2",
    "calendar",
    "cmd",
    "code",
    "codecs",
    "codeop",
    "collections",
    "collections.abc",
    "colorsys",
    "compileall",
    "concurrent.futures",
    "configparser",
    "contextlib",
    "copy",
    "copyreg",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "dis",
    "doctest",
    "email.charset",
    "email.contentmanager",
    "email.encoders",
    "email.errors",
    "email.generator",
    "email.header",
    "email.headerregistry",
    "email.iterators",
    "email.message",
    "email.mime.multipart",
    "email.mime.text",
    "email.parser",
    "email.policy",
    "email.utils",
    "enum",
    "filecmp",
    "fileinput",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "getopt",
    "gettext",
    "glob",
    "graphlib",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "html.parser",
    "http",
    "http.client",
    "http.cookiejar",
    "http.cookies",
    "http.server",
    "imaplib",
    "importlib",
    "importlib.abc",
    "importlib.machinery",
    "importlib.metadata",
    "importlib.resources",
    "importlib.util",
    "inspect",
    "io",
    "ipaddress",
    "json",
    "json.decoder",
    "json.encoder",
    "keyword",
    "linecache",
    "locale",
    "logging",
    "logging.config",
    "logging.handlers",
    "lzma",
    "mailbox",
    "mimetypes",
    "modulefinder",
    "netrc",
    "ntpath",
    "numbers",
    "opcode",
    "operator",
    "optparse",
    "os",
    "os.path",
    "pathlib",
    "pdb",
    "pickle",
    "pickletools",
    "pkgutil",
    "platform",
    "plistlib",
    "poplib",
    "pprint",
    "profile",
    "pstats",
    "py_compile",
    "pyclbr",
    "queue",
    "quopri",
    "random",
    "re",
    "reprlib",
    "runpy",
    "sched",
    "secrets",
    "selectors",
    "shelve",
    "shlex",
    "shutil",
    "smtplib",
    "socket",
    "socketserver",
    "ssl",
    "stat",
    "statistics",
    "string",
    "stringprep",
    "struct",
    "subprocess",
    "symtable",
    "sysconfig",
    "tabnanny",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "timeit",
    "token",
    "tokenize",
    "tomllib",
    "trace",
    "traceback",
    "tracemalloc",
    "types",
    "typing",
    "unittest.case",
    "unittest.loader",
    "unittest.mock",
    "unittest.runner",
    "unittest.suite",
    "urllib.error",
    "urllib.parse",
    "urllib.request",
    "urllib.robotparser",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "wsgiref.handlers",
    "wsgiref.headers",
    "wsgiref.simple_server",
    "wsgiref.util",
    "wsgiref.validate",
    "xml.dom.minidom",
    "xml.dom.pulldom",
    "xml.etree.ElementTree",
    "xml.sax.handler",
    "xml.sax.saxutils",
    "xmlrpc.client",
    "xmlrpc.server",
    "zipapp",
    "zipfile",
    "zipimport",
    "zoneinfo",
)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _doc(obj: object) -> str:
    # obj.__doc__, not inspect.getdoc: getdoc copies a base class's docstring into every override, which would
    # repeat the same text under many headings.
    raw = getattr(obj, "__doc__", None)
    return inspect.cleandoc(raw) if isinstance(raw, str) and raw.strip() else ""


def _signature(obj: Any) -> str:
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    return _ADDRESS.sub("", text)


def _public_names(module: ModuleType) -> list[str]:
    exported = getattr(module, "__all__", None)
    if isinstance(exported, list | tuple):
        names = [name for name in exported if isinstance(name, str) and hasattr(module, name)]
    else:
        names = [
            name
            for name, value in vars(module).items()
            if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
        ]
    return sorted(set(names))


def _section(heading: str, body: str) -> str:
    # A Markdown heading per member: the default chunker starts a chunk at each, so one chunk is one API item.
    return f"## {heading}\n{body}" if body else f"## {heading}"


def _class_sections(qualified: str, cls: type) -> list[str]:
    sections = [_section(f"class {qualified}{_signature(cls)}", _doc(cls))]
    for name in sorted(vars(cls)):
        if name.startswith("_"):
            continue
        member = vars(cls)[name]
        if isinstance(member, staticmethod | classmethod):
            member = member.__func__
        if isinstance(member, property):
            body, heading = _doc(member), f"{qualified}.{name} (property)"
        elif inspect.isfunction(member) or inspect.ismethoddescriptor(member) or inspect.isbuiltin(member):
            body, heading = _doc(member), f"{qualified}.{name}{_signature(member)}"
        else:
            continue
        if body:
            sections.append(_section(heading, body))
    return sections


def module_document(name: str, module: ModuleType) -> Document:
    """One module's documentation as a document: its docstring, then one section per public member."""
    sections = [_doc(module)]
    for member_name in _public_names(module):
        member = getattr(module, member_name)
        # Built-ins read as people write them: str.split, not builtins.str.split.
        qualified = member_name if name == "builtins" else f"{name}.{member_name}"
        if inspect.isclass(member):
            sections.extend(_class_sections(qualified, member))
        elif callable(member) and _doc(member):
            sections.append(_section(f"{qualified}{_signature(member)}", _doc(member)))
    first_line = _doc(module).split("\n", 1)[0].strip()
    return Document(
        doc_id=f"py:{name}",
        text="\n\n".join(s for s in sections if s),
        title=f"{name}: {first_line}" if first_line else name,
        metadata={"source": "python-docs", "kind": "module", "module": name},
    )


# reStructuredText section titles in the pydoc topics: a line underlined by a row of one punctuation mark.
_RST_TITLE = re.compile(r"^(\S[^\n]*)\n([*=\-~^\"'+#])\2{2,}[ \t]*$", re.MULTILINE)


def topic_documents() -> list[Document]:
    from pydoc_data.topics import topics

    documents = []
    for name in sorted(topics):
        text = _RST_TITLE.sub(r"## \1", topics[name])
        first_line = next((line.strip("# ") for line in text.splitlines() if line.strip()), name)
        documents.append(
            Document(
                doc_id=f"topic:{name}",
                text=text,
                title=first_line,
                metadata={"source": "python-docs", "kind": "topic", "topic": name},
            )
        )
    return documents


def stdlib_documents() -> list[Document]:
    """The demo corpus: pydoc topics, then the allowlisted modules, in a fixed order.

    With the default chunker it gives several thousand chunks on Python 3.11 (docs/tours/search.md states the measured
    count and build time).
    """
    documents = topic_documents()
    for name in STDLIB_MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module missing from this build is skipped, as documented
            continue
        document = module_document(name, module)
        if document.text.strip():
            documents.append(document)
    return documents
