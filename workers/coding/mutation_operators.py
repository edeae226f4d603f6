"""The repair family's mutation operators, for the task generator (issue 17 §1): where each operator can change a
function, and `repair_mutations`, every single-site mutation of one function.

    functions = find_functions("toolz/itertoolz.py", source)   # workers.coding.mutations
    for mutation in repair_mutations(source, functions[0]):      # every site of every operator in the function
        mutated = mutation.apply(source)

The records (`Edit`, `Mutation`, `FunctionInfo`), the offsets of ast positions in the text (`Text`), the function
helpers, the local parse check and the implement family's operator live in `workers.coding.mutations`. An
operator's token is found in the text *between* its operands (the ast gives no position for `<` or `and`), and a
site is skipped when that gap holds anything but the token, parentheses and whitespace (a comment, say): a site we
cannot edit exactly is not a site.

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
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Sequence

from workers.coding.mutations import Edit, FunctionInfo, LocalCheck, Mutation, Text, docstring_node, function_node

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


def _body_nodes(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    """Every node of the body in a stable order, docstring and f-string insides left out (before Python 3.12
    the positions of nodes inside an f-string are not reliable)."""
    body = node.body[1:] if docstring_node(node.body) else node.body
    inside_fstrings: set[int] = set()
    nodes: list[ast.AST] = []
    for statement in body:
        for child in ast.walk(statement):
            if isinstance(child, ast.JoinedStr):
                inside_fstrings.update(id(n) for n in ast.walk(child) if n is not child)
            nodes.append(child)
    nodes = [n for n in nodes if id(n) not in inside_fstrings and hasattr(n, "lineno")]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset, type(n).__name__))  # type: ignore[attr-defined]


def _gap_token(text: Text, left_end: int, right_start: int, token: str) -> tuple[int, int] | None:
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


def _describe(text: Text, start: int, before: str, after: str) -> tuple[int, str]:
    line = _line_of(text, start)
    return line, f"line {line}: `{before}` -> `{after}`"


def _line_of(text: Text, offset: int) -> int:
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


def _compare_sites(text: Text, nodes: Sequence[ast.AST]) -> Iterator[Site]:
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


def _arithmetic_sites(text: Text, nodes: Sequence[ast.AST]) -> Iterator[Site]:
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


def _boolean_sites(text: Text, nodes: Sequence[ast.AST]) -> Iterator[Site]:
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


def _plus_one(text: Text, node: ast.expr, delta: int) -> str:
    source = text.segment(node)
    unary = isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not)  # binds tighter than + and -
    if not isinstance(node, _ATOMIC) and not unary:
        source = f"({source})"
    return f"{source} {'+' if delta > 0 else '-'} 1"


def _off_by_one_sites(text: Text, nodes: Sequence[ast.AST]) -> Iterator[Site]:
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


def _is_elif(text: Text, statement: ast.If) -> bool:
    """Whether the If's else branch is written as `elif` (the ast nests it as an If either way)."""
    if len(statement.orelse) != 1 or not isinstance(statement.orelse[0], ast.If):
        return False
    inner = statement.orelse[0]
    line = text.line_text(inner.lineno)
    return text.indent(inner.lineno) == text.indent(statement.lineno) and line.lstrip().startswith("elif")


def _remove_branch_sites(text: Text, function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[Site]:
    docstring = docstring_node(function.body)
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


def _else_line(text: Text, statement: ast.If) -> int | None:
    """The line of an if statement's `else:` at the if's own indentation."""
    indent = text.indent(statement.lineno)
    first = statement.body[-1].end_lineno or statement.lineno
    for lineno in range(first + 1, statement.orelse[0].lineno + 1):
        line = text.line_text(lineno)
        if line.startswith(indent) and re.match(r"else\s*:", line[len(indent) :]):
            return lineno
    return None


def _negate_sites(text: Text, nodes: Sequence[ast.AST]) -> Iterator[Site]:
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


def _default_sites(text: Text, function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[Site]:
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


def _swap_args_sites(text: Text, nodes: Sequence[ast.AST]) -> Iterator[Site]:
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
    text = Text(source)
    node = function_node(source, function)
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
    check = LocalCheck(text, node)
    mutations: list[Mutation] = []
    for operator in operators:
        for name, line, detail, edits in generators[operator]:
            if check.changes_code(edits):
                mutations.append(Mutation(name, function.path, function.qualname, line, detail, edits))
    return mutations
