"""Documents in other formats, written as the Markdown sections the chunker splits on.

The chunker (`workers.search.corpus`) starts a chunk at a Markdown heading and keeps the heading path as chunk
context, and the task generator (`workers.search.synth`) reads code names from headings. So every format is first
turned into plain text whose sections are Markdown headings:

- **reStructuredText** (`rst_to_markdown`): underlined (and overlined) titles become `#` headings, levelled by the
  order their adornment styles first appear, as docutils does; an object directive (`.. function:: name(args)`,
  `.. class::`, `.. option:: --flag`, `.. setting:: name`, ...) becomes a heading naming the object; roles
  (`:func:`~os.path.join``) become the name in backticks (`~` keeps the last component), links their text;
  comments and targets (`.. _label:`) are dropped; other directives keep their argument and body.
- **Plain text** (`plain_text_to_markdown`): a line underlined with `===` or `---`, and an upper-case line of a
  few words between a blank line and text (`DESCRIPTION`, `ENVIRONMENT VARIABLES`), are headings.
- **Python source** (`python_to_markdown`): the module docstring and comments first, then one section per class,
  function and method, headed by its qualified name and signature (`## package.module.Class.method(self, x)`),
  holding its docstring and the comments in its body; code itself is left out (it is not prose a search agent
  quotes, and the signature names it).
- **HTML** stays in `workers.search.corpus_files.html_to_text` (headings and `<dt>` terms as headings; navigation,
  headers, footers and sidebars dropped).
"""

from __future__ import annotations

import ast
import re
import textwrap

__all__ = ["plain_text_to_markdown", "python_to_markdown", "rst_to_markdown"]

_ADORNMENT = re.compile(r"^([=\-~^\"'`#*+:.!_<>])\1{2,}\s*$")
# Object directives of Sphinx's Python, std and common extension domains, and the ones projects define (celery's
# `setting`): their argument names the object.
_OBJECT_DIRECTIVE = re.compile(
    r"^\s*\.\.\s+(?:[a-z]+:)?(function|class|method|classmethod|staticmethod|attribute|data|exception|decorator|"
    r"module|option|envvar|confval|setting|signal|program|describe|object|property|cmdoption|fixture|event)"
    r"::\s*(.*)$"
)
_DIRECTIVE = re.compile(r"^\s*\.\.\s+([\w:-]+)::\s*(.*)$")
_COMMENT = re.compile(r"^\s*\.\.(?:\s|$)")
_ROLE = re.compile(r":[\w.:+-]+:`(~?)([^`<]*?)(?:\s*<([^>`]*)>)?`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^>`]+>`__?")
_REFERENCE = re.compile(r"`([^`]+)`_\b")
_OPTION_FIELD = re.compile(r"^\s+:[\w -]+:.*$")


def _role(match: re.Match[str]) -> str:
    tilde, text, target = match.group(1), match.group(2).strip(), match.group(3)
    name = text or (target or "")
    if tilde:
        name = name.rsplit(".", 1)[-1]
    return f"`{name}`" if name else ""


def _inline(line: str) -> str:
    line = _ROLE.sub(_role, line)
    line = _LINK.sub(r"\1", line)
    line = _REFERENCE.sub(r"\1", line)
    return line.replace("``", "`")


def _is_title(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not _ADORNMENT.match(stripped) and not stripped.startswith("..") and len(stripped) < 200


def rst_to_markdown(text: str) -> str:
    """reStructuredText as Markdown-headed text (module docstring)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    levels: dict[tuple[str, bool], int] = {}
    out: list[str] = []
    skip_indented: int | None = None  # skipping the body of a comment or directive indented past this
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        after = lines[i + 2] if i + 2 < len(lines) else ""
        if skip_indented is not None:
            if not line.strip() or _indent(line) > skip_indented:
                i += 1
                continue
            skip_indented = None
        over = _ADORNMENT.match(line)
        # Overlined title: adornment, title, the same adornment.
        if over and _is_title(nxt) and _ADORNMENT.match(after) and after.strip()[0] == line.strip()[0]:
            out.extend(["", _heading(levels, (line.strip()[0], True), nxt.strip()), ""])
            i += 3
            continue
        under = _ADORNMENT.match(nxt)
        if under and _is_title(line) and not line[:1].isspace() and len(nxt.strip()) >= len(line.strip()) - 2:
            out.extend(["", _heading(levels, (nxt.strip()[0], False), _inline(line.strip())), ""])
            i += 2
            continue
        if over:  # a transition line
            i += 1
            continue
        obj = _OBJECT_DIRECTIVE.match(line)
        if obj:
            name = obj.group(2).strip() or obj.group(1)
            out.extend(["", f"{'#' * min(6, len(levels) + 1)} {_inline(name)}", ""])
            i += 1
            # The directive's options (`:noindex:`) say nothing; its indented body stays as text.
            while i < len(lines) and _OPTION_FIELD.match(lines[i]):
                i += 1
            continue
        directive = _DIRECTIVE.match(line)
        if directive:
            argument = directive.group(2).strip()
            if directive.group(1) in ("toctree", "contents", "only", "raw", "include", "image", "figure"):
                skip_indented = _indent(line)
            elif argument:
                out.append(_inline(argument))
            i += 1
            while i < len(lines) and _OPTION_FIELD.match(lines[i]):
                i += 1
            continue
        if _COMMENT.match(line):
            # A comment or a target (`.. _label:`), with any indented continuation.
            skip_indented = _indent(line)
            i += 1
            continue
        out.append(_inline(line[:-1] if line.rstrip().endswith("::") and line.strip() != "::" else line))
        i += 1
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip() + "\n"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _heading(levels: dict[tuple[str, bool], int], style: tuple[str, bool], title: str) -> str:
    level = levels.setdefault(style, len(levels) + 1)
    return f"{'#' * min(level, 6)} {title}"


_UPPER_HEADING = re.compile(r"^[A-Z][A-Z0-9 /&()_-]{2,60}$")


def plain_text_to_markdown(text: str) -> str:
    """Plain text with its section headings as Markdown headings (module docstring); other lines unchanged."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line, nxt = lines[i], lines[i + 1] if i + 1 < len(lines) else ""
        before = lines[i - 1] if i > 0 else ""
        under = _ADORNMENT.match(nxt)
        if under and _is_title(line) and not line[:1].isspace() and nxt.strip()[0] in "=-~":
            out.extend(["", f"{'#' if nxt.strip()[0] == '=' else '##'} {line.strip()}", ""])
            i += 2
            continue
        if (
            _UPPER_HEADING.match(line)
            and len(line.split()) <= 6
            and not before.strip()
            and nxt.strip()
            and not _UPPER_HEADING.match(nxt)
        ):
            out.extend([f"## {line.strip()}", ""])
            i += 1
            continue
        out.append(line)
        i += 1
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip() + "\n"


def _comments(source_lines: list[str], node: ast.AST, skip: set[int]) -> list[str]:
    start, end = getattr(node, "lineno", 1), getattr(node, "end_lineno", len(source_lines))
    found: list[str] = []
    for number in range(start, end + 1):
        if number in skip:
            continue
        stripped = source_lines[number - 1].strip()
        if stripped.startswith("#") and not stripped.startswith("#!") and "coding:" not in stripped:
            body = stripped.lstrip("#").strip()
            if body and not body.startswith(("noqa", "type:", "pragma", "fmt:", "pylint")):
                found.append(body)
    return found


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    try:
        return ast.unparse(node.args)
    except (ValueError, TypeError):  # pragma: no cover - ast.unparse handles every parsed tree
        return "..."


def python_to_markdown(source: str, module: str) -> str:
    """Docstrings and comments of Python source as Markdown sections (module docstring). Raises SyntaxError when
    the source does not parse."""
    tree = ast.parse(source)
    lines = source.split("\n")
    owned: set[int] = set()  # lines inside a class or function: their comments go to that section
    sections: list[str] = []

    def visit(body: list[ast.stmt], prefix: str, depth: int) -> None:
        for node in body:
            if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            inner = set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
            nested = [n for n in node.body if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]
            nested_lines = {ln for n in nested for ln in range(n.lineno, (n.end_lineno or n.lineno) + 1)}
            name = f"{prefix}.{node.name}"
            if isinstance(node, ast.ClassDef):
                bases = ", ".join(ast.unparse(b) for b in node.bases)
                title = f"class {name}({bases})" if bases else f"class {name}"
            else:
                title = f"{name}({_signature(node)})"
            doc = "\n".join(_inline(line) for line in (ast.get_docstring(node) or "").split("\n"))
            comments = _comments(lines, node, nested_lines)
            if doc or comments:
                text = [f"{'#' * min(6, depth)} {title}", doc]
                if comments:
                    text.append(" ".join(comments))
                sections.append("\n\n".join(part for part in text if part))
            owned.update(inner)
            visit(node.body, name, depth + 1)

    visit(tree.body, module, 2)
    head = [f"# {module}"]
    docstring = ast.get_docstring(tree)
    if docstring:
        head.append("\n".join(_inline(line) for line in textwrap.dedent(docstring).split("\n")))
    module_comments = [c for c in _comments(lines, tree, owned) if c]
    if module_comments:
        head.append(" ".join(module_comments))
    return "\n\n".join(head + sections).strip() + "\n"
