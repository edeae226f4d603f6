"""Procedural edits of one function's source, for the task generator (issue 17 §1, in the manner of SWE-smith).

    functions = find_functions("toolz/itertoolz.py", source)
    for mutation in repair_mutations(source, functions[0]):      # every site of every operator in the function
        mutated = mutation.apply(source)
    gutted = implement_mutation(source, functions[0])          # the body replaced by `raise NotImplementedError`

Every edit is a span of the original text (found from the ast's line and column offsets, which count UTF-8 bytes)
replaced by new text, so the rest of the file stays byte-identical: `ast.unparse` of a module would reformat it and
turn a one-line bug into a whole-file diff. An operator's token is found in the text *between* its operands (the
ast gives no position for `<` or `and`), and a site is skipped when that gap holds anything but the token,
parentheses and whitespace (a comment, say): a site we cannot edit exactly is not a site.

Operators (`Mutation.operator`):
  compare        `<`/`<=`, `>`/`>=`, `==`/`!=`, `is`/`is not`, `in`/`not in`
  arithmetic     `+`/`-`, `*`/`//`, `/` to `*`, `+=`/`-=` (not on string, list or tuple literals: that is a
                 TypeError, not a bug worth finding)
  boolean        `and`/`or` (every operator of one chain)
  off_by_one     an integer constant plus or minus one; a slice bound or `range()` argument plus or minus one
  remove_branch  an `if` statement without an `else` deleted (a guard clause), an `else` or one `elif` branch
                 deleted
  negate         the condition of an `if`, `while`, conditional expression or comprehension filter negated
  default        a default argument of the function changed (a bool flipped, a number plus one, a string emptied)
  swap_args      the first two positional arguments of a call swapped
  remove_body    (the implement family) the body after the docstring replaced by `raise NotImplementedError`

Nothing here runs code: whether the library's tests notice a mutation is the generator's business.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

REPAIR_OPERATORS = (
    "compare",
    "arithmetic",
    "boolean",
    "off_by_one",
    "remove_branch",
    "negate",
    "default",
    "swap_args",
)
IMPLEMENT_OPERATOR = "remove_body"

_COMPARE_SWAP: dict[type[ast.cmpop], tuple[str, str]] = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
}
_ARITHMETIC_SWAP: dict[type[ast.operator], tuple[str, str]] = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "//"),
    ast.FloorDiv: ("//", "*"),
    ast.Div: ("/", "*"),
}
_BOOLEAN_SWAP: dict[type[ast.boolop], tuple[str, str]] = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
# Calls whose swapped arguments are an immediate TypeError on any input: caught, but not a bug anyone writes.
_SWAP_SKIP_CALLS = frozenset({"isinstance", "issubclass", "getattr", "setattr", "hasattr", "super"})
# Expressions that need no parentheses as an operand of `not` or `+ 1`.
_ATOMIC = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)
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


class _Text:
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


def _docstring_node(body: Sequence[ast.stmt]) -> ast.Expr | None:
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
    rest = list(body[1:] if _docstring_node(body) else body)
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
                doc = _docstring_node(node.body)
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


def _function_node(source: str, function: FunctionInfo) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The function's node in `source` (FunctionInfo.node may come from another parse of the same text)."""
    for candidate in _functions_cached(function.path, source):
        if candidate.qualname == function.qualname and candidate.lineno == function.lineno:
            return candidate.node
    raise LookupError(f"{function.qualname} (line {function.lineno}) is not in this source")


@functools.lru_cache(maxsize=8)
def _functions_cached(path: str, source: str) -> tuple[FunctionInfo, ...]:
    return tuple(find_functions(path, source))


# --- sites ---------------------------------------------------------------------------------------------------------


def _body_nodes(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    """Every node of the body in a stable order, docstring and f-string insides left out (before Python 3.12
    the positions of nodes inside an f-string are not reliable)."""
    body = node.body[1:] if _docstring_node(node.body) else node.body
    inside_fstrings: set[int] = set()
    nodes: list[ast.AST] = []
    for statement in body:
        for child in ast.walk(statement):
            if isinstance(child, ast.JoinedStr):
                inside_fstrings.update(id(n) for n in ast.walk(child) if n is not child)
            nodes.append(child)
    nodes = [n for n in nodes if id(n) not in inside_fstrings and hasattr(n, "lineno")]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset, type(n).__name__))  # type: ignore[attr-defined]


def _gap_token(text: _Text, left_end: int, right_start: int, token: str) -> tuple[int, int] | None:
    """Where `token` sits between two operands, when the gap holds only it, parentheses and whitespace."""
    gap = text.source[left_end:right_start]
    if "#" in gap or re.sub(r"[\s()\\]", "", gap) != token.replace(" ", ""):
        return None
    pattern = r"\s+".join(re.escape(part) for part in token.split(" "))
    if token[0].isalpha():
        pattern = rf"(?<![\w]){pattern}(?![\w])"
    matches = list(re.finditer(pattern, gap))
    if len(matches) != 1:
        return None
    return left_end + matches[0].start(), left_end + matches[0].end()


def _describe(text: _Text, start: int, before: str, after: str) -> tuple[int, str]:
    line = _line_of(text, start)
    return line, f"line {line}: `{before}` -> `{after}`"


def _line_of(text: _Text, offset: int) -> int:
    low, high = 0, len(text.starts) - 1
    while low < high:
        middle = (low + high + 1) // 2
        if text.starts[middle] <= offset:
            low = middle
        else:
            high = middle - 1
    return low + 1


def _is_sequence_literal(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str | bytes)
    return isinstance(node, ast.JoinedStr | ast.List | ast.Tuple | ast.ListComp)


Site = tuple[str, int, str, tuple[Edit, ...]]  # operator, line, detail, edits


def _compare_sites(text: _Text, nodes: Sequence[ast.AST]) -> Iterator[Site]:
    for node in nodes:
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for index, op in enumerate(node.ops):
            swap = _COMPARE_SWAP.get(type(op))
            if swap is None:
                continue
            where = _gap_token(text, text.end(operands[index]), text.start(operands[index + 1]), swap[0])
            if where is None:
                continue
            line, detail = _describe(text, where[0], swap[0], swap[1])
            yield "compare", line, detail, (Edit(where[0], where[1], swap[1]),)


def _arithmetic_sites(text: _Text, nodes: Sequence[ast.AST]) -> Iterator[Site]:
    for node in nodes:
        if isinstance(node, ast.BinOp):
            left, right, op, suffix = node.left, node.right, node.op, ""
        elif isinstance(node, ast.AugAssign):
            left, right, op, suffix = node.target, node.value, node.op, "="
        else:
            continue
        swap = _ARITHMETIC_SWAP.get(type(op))
        if swap is None or _is_sequence_literal(left) or _is_sequence_literal(right):
            continue
        where = _gap_token(text, text.end(left), text.start(right), swap[0] + suffix)
        if where is None:
            continue
        line, detail = _describe(text, where[0], swap[0] + suffix, swap[1] + suffix)
        yield "arithmetic", line, detail, (Edit(where[0], where[1], swap[1] + suffix),)


def _boolean_sites(text: _Text, nodes: Sequence[ast.AST]) -> Iterator[Site]:
    for node in nodes:
        if not isinstance(node, ast.BoolOp):
            continue
        before, after = _BOOLEAN_SWAP[type(node.op)]
        edits = []
        for left, right in zip(node.values, node.values[1:], strict=False):
            where = _gap_token(text, text.end(left), text.start(right), before)
            if where is None:
                break
            edits.append(Edit(where[0], where[1], after))
        else:
            line, detail = _describe(text, edits[0].start, before, after)
            yield "boolean", line, detail, tuple(edits)


def _plus_one(text: _Text, node: ast.expr, delta: int) -> str:
    source = text.segment(node)
    unary = isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not)  # binds tighter than + and -
    if not isinstance(node, _ATOMIC) and not unary:
        source = f"({source})"
    return f"{source} {'+' if delta > 0 else '-'} 1"


def _off_by_one_sites(text: _Text, nodes: Sequence[ast.AST]) -> Iterator[Site]:
    for node in nodes:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            segment = text.segment(node)
            try:
                if ast.literal_eval(segment) != node.value:
                    continue
            except (ValueError, SyntaxError):
                continue
            for delta in (1, -1):
                new = str(node.value + delta)
                line, detail = _describe(text, text.start(node), segment, new)
                yield "off_by_one", line, detail, (Edit(text.start(node), text.end(node), new),)
            continue
        bounds: list[ast.expr] = []
        if isinstance(node, ast.Slice):
            bounds = [b for b in (node.lower, node.upper) if b is not None]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
            bounds = [a for a in node.args if not isinstance(a, ast.Starred)]
        for bound in bounds:
            if isinstance(bound, ast.Constant) or (
                isinstance(bound, ast.UnaryOp) and isinstance(bound.operand, ast.Constant)
            ):
                continue  # the constant rule covers it
            for delta in (1, -1):
                new = _plus_one(text, bound, delta)
                line, detail = _describe(text, text.start(bound), text.segment(bound), new)
                yield "off_by_one", line, detail, (Edit(text.start(bound), text.end(bound), new),)


def _statement_blocks(
    function: ast.FunctionDef | ast.AsyncFunctionDef,
) -> Iterator[tuple[ast.AST, str, list[ast.stmt]]]:
    """Every statement list inside the function with its owner and field (body, orelse, finalbody)."""
    for node in ast.walk(function):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield node, name, block


def _is_elif(text: _Text, statement: ast.If) -> bool:
    """Whether the If's else branch is written as `elif` (the ast nests it as an If either way)."""
    if len(statement.orelse) != 1 or not isinstance(statement.orelse[0], ast.If):
        return False
    inner = statement.orelse[0]
    line = text.line_text(inner.lineno)
    return text.indent(inner.lineno) == text.indent(statement.lineno) and line.lstrip().startswith("elif")


def _remove_branch_sites(text: _Text, function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[Site]:
    docstring = _docstring_node(function.body)
    for owner, name, block in _statement_blocks(function):
        for statement in block:
            if not isinstance(statement, ast.If) or not text.owns_lines(statement):
                continue
            is_elif = isinstance(owner, ast.If) and name == "orelse" and _is_elif(text, owner)
            if not statement.orelse:
                if is_elif:
                    continue  # deleting an elif is deleting a branch of the If it continues (below)
                # A guard clause or a conditional step deleted; a block left empty gets `pass`.
                start, end = text.line_start(statement.lineno), text.line_end(statement.end_lineno or statement.lineno)
                others = [s for s in block if s is not statement and s is not docstring]
                replacement = "" if others else f"{text.indent(statement.lineno)}pass\n"
                line = statement.lineno
                yield "remove_branch", line, f"line {line}: `if` statement deleted", (Edit(start, end, replacement),)
            elif _is_elif(text, statement):
                inner = statement.orelse[0]
                assert isinstance(inner, ast.If)
                last = inner.body[-1]
                if not text.owns_lines(last):
                    continue
                start, end = text.line_start(inner.lineno), text.line_end(last.end_lineno or last.lineno)
                line = inner.lineno
                yield "remove_branch", line, f"line {line}: `elif` branch deleted", (Edit(start, end, ""),)
            else:
                last = statement.orelse[-1]
                else_line = _else_line(text, statement)
                if else_line is None or not text.owns_lines(last):
                    continue
                start, end = text.line_start(else_line), text.line_end(last.end_lineno or last.lineno)
                yield "remove_branch", else_line, f"line {else_line}: `else` branch deleted", (Edit(start, end, ""),)


def _else_line(text: _Text, statement: ast.If) -> int | None:
    """The line of an if statement's `else:` at the if's own indentation."""
    indent = text.indent(statement.lineno)
    first = statement.body[-1].end_lineno or statement.lineno
    for lineno in range(first + 1, statement.orelse[0].lineno + 1):
        line = text.line_text(lineno)
        if line.startswith(indent) and re.match(r"else\s*:", line[len(indent) :]):
            return lineno
    return None


def _negate_sites(text: _Text, nodes: Sequence[ast.AST]) -> Iterator[Site]:
    tests: list[ast.expr] = []
    for node in nodes:
        if isinstance(node, ast.If | ast.While | ast.IfExp):
            tests.append(node.test)
        elif isinstance(node, ast.comprehension):
            tests.extend(node.ifs)
    for test in tests:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = test.operand
            new = text.segment(inner)
            if not isinstance(inner, (*_ATOMIC, ast.Compare)):
                new = f"({new})"
        else:
            source = text.segment(test)
            new = f"not {source}" if isinstance(test, (*_ATOMIC, ast.Compare)) else f"not ({source})"
        old = text.segment(test)
        line, _ = _describe(text, text.start(test), old, new)
        detail = f"line {line}: condition negated"
        yield "negate", line, detail, (Edit(text.start(test), text.end(test), new),)


def _default_sites(text: _Text, function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[Site]:
    defaults = [*function.args.defaults, *(d for d in function.args.kw_defaults if d is not None)]
    for default in defaults:
        if not isinstance(default, ast.Constant):
            continue
        value = default.value
        if isinstance(value, bool):
            new = repr(not value)
        elif isinstance(value, int | float):
            new = repr(value + 1)
        elif isinstance(value, str) and value:
            new = '""' if text.segment(default).startswith('"') else "''"
        else:
            continue
        old = text.segment(default)
        line, detail = _describe(text, text.start(default), old, new)
        yield "default", line, f"{detail} (default argument)", (Edit(text.start(default), text.end(default), new),)


def _swap_args_sites(text: _Text, nodes: Sequence[ast.AST]) -> Iterator[Site]:
    for node in nodes:
        if not isinstance(node, ast.Call) or len(node.args) < 2:
            continue
        if isinstance(node.func, ast.Name) and node.func.id in _SWAP_SKIP_CALLS:
            continue
        first, second = node.args[0], node.args[1]
        if isinstance(first, ast.Starred) or isinstance(second, ast.Starred):
            continue
        a, b = text.segment(first), text.segment(second)
        if a == b:
            continue
        edits = (Edit(text.start(first), text.end(first), b), Edit(text.start(second), text.end(second), a))
        call = text.segment(node.func)
        line, _ = _describe(text, text.start(node), a, b)
        yield "swap_args", line, f"line {line}: arguments of `{call}(...)` swapped (`{a}`, `{b}`)", edits


def repair_mutations(
    source: str, function: FunctionInfo, operators: Sequence[str] = REPAIR_OPERATORS
) -> list[Mutation]:
    """Every single-site mutation of the function by the given operators, in source order. Each keeps the rest of
    the file byte-identical and parses; one that would not (or that changes nothing) is left out."""
    unknown = set(operators) - set(REPAIR_OPERATORS)
    if unknown:
        raise ValueError(f"unknown mutation operators {sorted(unknown)}; known: {', '.join(REPAIR_OPERATORS)}")
    text = _Text(source)
    node = _function_node(source, function)
    nodes = _body_nodes(node)
    generators: dict[str, Iterator[Site]] = {
        "compare": _compare_sites(text, nodes),
        "arithmetic": _arithmetic_sites(text, nodes),
        "boolean": _boolean_sites(text, nodes),
        "off_by_one": _off_by_one_sites(text, nodes),
        "remove_branch": _remove_branch_sites(text, node),
        "negate": _negate_sites(text, nodes),
        "default": _default_sites(text, node),
        "swap_args": _swap_args_sites(text, nodes),
    }
    check = _LocalCheck(text, node)
    mutations: list[Mutation] = []
    for operator in operators:
        for name, line, detail, edits in generators[operator]:
            if check.changes_code(edits):
                mutations.append(Mutation(name, function.path, function.qualname, line, detail, edits))
    return mutations


class _LocalCheck:
    """Whether edits inside one function parse and change code, judged on the function's own lines: every edit
    lies inside it, and parsing the whole module for each of hundreds of sites would cost seconds a file."""

    def __init__(self, text: _Text, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
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
    text = _Text(source)
    node = _function_node(source, function)
    docstring = _docstring_node(node.body)
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
    return mutation if _LocalCheck(text, node).changes_code(mutation.edits) else None


def changes_code(before: str, after: str, *, original_dump: str | None = None) -> bool:
    """Whether `after` parses, compiles and differs from `before` as code (not just in layout)."""
    try:
        tree = ast.parse(after)
        compile(tree, "<mutation>", "exec")
    except (SyntaxError, ValueError):
        return False
    return ast.dump(tree) != (original_dump if original_dump is not None else ast.dump(ast.parse(before)))
