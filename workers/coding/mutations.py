"""Procedural edits of one function's source, for the task generator (issue 17 §1, in the manner of SWE-smith): the
edit and mutation records, the functions that can be mutated, and the implement family's operator.

    functions = find_functions("toolz/itertoolz.py", source)
    for mutation in repair_mutations(source, functions[0]):      # workers.coding.mutation_operators
        mutated = mutation.apply(source)
    gutted = implement_mutation(source, functions[0])          # the body replaced by `raise NotImplementedError`

Every edit is a span of the original text (found from the ast's line and column offsets, which count UTF-8 bytes)
replaced by new text, so the rest of the file stays byte-identical: `ast.unparse` of a module would reformat it and
turn a one-line bug into a whole-file diff.

The repair family's operators (compare, arithmetic, boolean, off_by_one, remove_branch, negate, default,
swap_args) and `repair_mutations` live in `workers.coding.mutation_operators`, on top of `Text`, `LocalCheck` and
the function helpers here. The implement family's operator (`Mutation.operator`):
  remove_body    the body after the docstring replaced by `raise NotImplementedError`

Nothing here runs code: whether the library's tests notice a mutation is the generator's business.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

IMPLEMENT_OPERATOR = "remove_body"
_NEWLINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


@dataclass(frozen=True)
class Edit:
    """Replace the characters [start, end) of the original text with `text`."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class FunctionInfo:
    """A function or method that can be mutated. Lines are 1-based and inclusive (decorators not included)."""

    path: str
    qualname: str  # "Class.method" or "function"
    name: str
    class_name: str | None
    lineno: int
    end_lineno: int
    docstring: str | None
    node: ast.FunctionDef | ast.AsyncFunctionDef = field(compare=False, repr=False)

    @property
    def module(self) -> str:
        """Dotted module name, from the path (`src/isodate/isodates.py` -> `isodate.isodates`)."""
        parts = self.path.removesuffix(".py").split("/")
        if parts and parts[0] == "src":
            parts = parts[1:]
        if parts and parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(parts)


@dataclass(frozen=True)
class Mutation:
    """One candidate change to one file. `detail` says what changed (for reports; never shown to the agent)."""

    operator: str
    path: str
    function: str
    line: int  # 1-based line of the (first) change in the original
    detail: str
    edits: tuple[Edit, ...]

    def apply(self, source: str) -> str:
        return apply_edits(source, self.edits)


def apply_edits(source: str, edits: Sequence[Edit]) -> str:
    """The source with every edit made; edits must not overlap (ValueError)."""
    ordered = sorted(edits, key=lambda e: (e.start, e.end))
    for before, after in zip(ordered, ordered[1:], strict=False):
        if after.start < before.end:
            raise ValueError(f"overlapping edits at characters {before.start}-{before.end} and {after.start}")
    out: list[str] = []
    cursor = 0
    for edit in ordered:
        out.append(source[cursor : edit.start])
        out.append(edit.text)
        cursor = edit.end
    out.append(source[cursor:])
    return "".join(out)


def combine(mutations: Sequence[Mutation]) -> Mutation:
    """Several mutations of one file as one (the repair family's multi-function candidates)."""
    if not mutations:
        raise ValueError("nothing to combine")
    paths = {m.path for m in mutations}
    if len(paths) != 1:
        raise ValueError(f"mutations of different files cannot be combined: {sorted(paths)}")
    edits = tuple(e for m in mutations for e in m.edits)
    first = min(mutations, key=lambda m: m.line)
    return Mutation(
        operator="+".join(m.operator for m in mutations),
        path=first.path,
        function="+".join(m.function for m in mutations),
        line=first.line,
        detail="; ".join(m.detail for m in mutations),
        edits=edits,
    )


class Text:
    """Character offsets of ast positions: line starts, and a column's UTF-8 byte offset turned into characters."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: list[str] = _NEWLINE.findall(source)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col_bytes: int) -> int:
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ""
        return self.starts[lineno - 1] + len(line.encode()[:col_bytes].decode())

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        end_lineno: int = node.end_lineno  # type: ignore[attr-defined]
        end_col: int = node.end_col_offset  # type: ignore[attr-defined]
        return self.offset(end_lineno, end_col)

    def segment(self, node: ast.AST) -> str:
        return self.source[self.start(node) : self.end(node)]

    def line_start(self, lineno: int) -> int:
        return self.starts[lineno - 1]

    def line_end(self, lineno: int) -> int:
        """Offset just past the line's newline (the start of the next line)."""
        return self.starts[lineno]

    def line_text(self, lineno: int) -> str:
        return self.lines[lineno - 1].rstrip("\r\n")

    def indent(self, lineno: int) -> str:
        text = self.line_text(lineno)
        return text[: len(text) - len(text.lstrip())]

    def owns_lines(self, node: ast.stmt) -> bool:
        """Whether the statement starts its first line and ends its last one (comments aside), so deleting its
        lines deletes nothing else."""
        before = self.source[self.line_start(node.lineno) : self.start(node)]
        end_lineno: int = node.end_lineno  # type: ignore[assignment]
        after = self.source[self.end(node) : self.line_end(end_lineno)].strip()
        return not before.strip() and (not after or after.startswith("#"))


# --- functions -----------------------------------------------------------------------------------------------------


def docstring_node(body: Sequence[ast.stmt]) -> ast.Expr | None:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first
    return None


def _decorator_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names = set()
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, ast.Attribute):
            names.add(target.attr)
    return names


def _is_stub(body: Sequence[ast.stmt]) -> bool:
    """A body with nothing to mutate: a docstring, `pass`, `...` or a bare `raise NotImplementedError`."""
    rest = list(body[1:] if docstring_node(body) else body)
    if not rest:
        return True
    if len(rest) > 1:
        return False
    only = rest[0]
    if isinstance(only, ast.Pass):
        return True
    if isinstance(only, ast.Expr) and isinstance(only.value, ast.Constant) and only.value.value is Ellipsis:
        return True
    if isinstance(only, ast.Raise) and only.exc is not None:
        exc = only.exc.func if isinstance(only.exc, ast.Call) else only.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return False


def find_functions(path: str, source: str) -> list[FunctionInfo]:
    """Module-level functions and the methods of module-level classes (nested classes too), in source order.
    Stubs, overloads and abstract methods are left out: there is nothing in them to break."""
    tree = ast.parse(source)
    found: list[FunctionInfo] = []

    def visit(body: Sequence[ast.stmt], prefix: str, class_name: str | None) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.", node.name)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if _decorator_names(node) & {"overload", "abstractmethod"} or _is_stub(node.body):
                    continue
                doc = docstring_node(node.body)
                docstring = ast.get_docstring(node) if doc is not None else None
                found.append(
                    FunctionInfo(
                        path=path,
                        qualname=f"{prefix}{node.name}",
                        name=node.name,
                        class_name=class_name,
                        lineno=node.lineno,
                        end_lineno=node.end_lineno or node.lineno,
                        docstring=docstring,
                        node=node,
                    )
                )

    visit(tree.body, "", None)
    return found


def function_node(source: str, function: FunctionInfo) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The function's node in `source` (FunctionInfo.node may come from another parse of the same text)."""
    for candidate in _functions_cached(function.path, source):
        if candidate.qualname == function.qualname and candidate.lineno == function.lineno:
            return candidate.node
    raise LookupError(f"{function.qualname} (line {function.lineno}) is not in this source")


@functools.lru_cache(maxsize=8)
def _functions_cached(path: str, source: str) -> tuple[FunctionInfo, ...]:
    return tuple(find_functions(path, source))


class LocalCheck:
    """Whether edits inside one function parse and change code, judged on the function's own lines: every edit
    lies inside it, and parsing the whole module for each of hundreds of sites would cost seconds a file."""

    def __init__(self, text: Text, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.source = text.source
        self.start, self.end = text.line_start(node.lineno), text.line_end(node.end_lineno or node.lineno)
        self.wrap = "if True:\n" if text.indent(node.lineno) else ""  # a method's lines, indented, in a block
        try:
            self.original = ast.dump(ast.parse(self.wrap + self.source[self.start : self.end]))
        except SyntaxError:  # e.g. a line continuation into the function: judge on the whole module
            self.start, self.end, self.wrap = 0, len(self.source), ""
            self.original = ast.dump(ast.parse(self.source))

    def changes_code(self, edits: Sequence[Edit]) -> bool:
        if any(edit.start < self.start or edit.end > self.end for edit in edits):
            return False
        local = [Edit(edit.start - self.start, edit.end - self.start, edit.text) for edit in edits]
        snippet = self.wrap + apply_edits(self.source[self.start : self.end], local)
        return changes_code("", snippet, original_dump=self.original)


def implement_mutation(source: str, function: FunctionInfo) -> Mutation | None:
    """The function's body after its docstring replaced by `raise NotImplementedError` (docstring, signature and
    decorators kept). None when the body does not start on a line of its own (`def f(): return 1`)."""
    text = Text(source)
    node = function_node(source, function)
    docstring = docstring_node(node.body)
    rest = node.body[1:] if docstring else node.body
    if not rest or not all(text.owns_lines(s) for s in (rest[0], rest[-1])):
        return None
    first_line = (docstring.end_lineno or docstring.lineno) + 1 if docstring else rest[0].lineno
    if docstring is not None and not text.owns_lines(docstring):
        return None
    if first_line <= node.lineno:
        return None
    indent = text.indent(rest[0].lineno)
    start, end = text.line_start(first_line), text.line_end(rest[-1].end_lineno or rest[-1].lineno)
    edit = Edit(start, end, f"{indent}raise NotImplementedError\n")
    removed = (rest[-1].end_lineno or rest[-1].lineno) - first_line + 1
    mutation = Mutation(
        IMPLEMENT_OPERATOR,
        function.path,
        function.qualname,
        first_line,
        f"lines {first_line}-{first_line + removed - 1}: body removed ({removed} lines)",
        (edit,),
    )
    return mutation if LocalCheck(text, node).changes_code(mutation.edits) else None


def changes_code(before: str, after: str, *, original_dump: str | None = None) -> bool:
    """Whether `after` parses, compiles and differs from `before` as code (not just in layout)."""
    try:
        tree = ast.parse(after)
        compile(tree, "<mutation>", "exec")
    except (SyntaxError, ValueError):
        return False
    return ast.dump(tree) != (original_dump if original_dump is not None else ast.dump(ast.parse(before)))
