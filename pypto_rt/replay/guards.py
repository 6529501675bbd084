"""Guards: what a replay checks before it touches data, kept in one normal form; `GUARD_MISS` when one fails."""
from __future__ import annotations

import ast
import random
import re

_NEGATED = {"==": "!=", "!=": "==", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}
_MIRRORED = {"==": "==", "!=": "!=", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
_LITERAL = re.compile(r"-?[0-9.]+(e[-+]?[0-9]+)?")
_SYMBOL = re.compile(r"\bs\d+\b")


class _GuardMiss:
    def __repr__(self):
        return "GUARD_MISS"


GUARD_MISS = _GuardMiss()   # what a replay returns when its guards do not hold: the call runs on the engine


def normal_form(left: str, symbol: str, right: str, outcome: bool) -> tuple[str, str, str]:
    """`left symbol right` coming out as `outcome`, as a check that must hold, in one form (`s1 < 0` false is
    `s1 >= 0`; `0 <= s1` is `s1 >= 0`), so repeated checks are kept once."""
    if not outcome:
        symbol = _NEGATED[symbol]
    if _LITERAL.fullmatch(left) and not _LITERAL.fullmatch(right):
        left, symbol, right = right, _MIRRORED[symbol], left
    return left, symbol, right


def symbols_in(code: str) -> set[str]:
    """The names of numbers read from data (`s<n>`) in a guard's side."""
    return set(_SYMBOL.findall(code))


_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
ARITHMETIC = (ast.Add, ast.Sub, ast.Mult)   # integer arithmetic that cannot raise: safe before a guard
_COMPARE = {"==": lambda d: d == 0, "!=": lambda d: d != 0, "<": lambda d: d < 0, "<=": lambda d: d <= 0,
            ">": lambda d: d > 0, ">=": lambda d: d >= 0}


def holds_always(left: str, symbol: str, right: str, int_names: set) -> bool:
    """Whether `left symbol right` holds for any values of its names: both sides are +, -, * of integer names and
    integer constants (polynomials with integer values, exact), and their difference is the same constant at
    several random points (a nonzero polynomial is zero at random points with negligible chance)."""
    occurrences = _IDENTIFIER.findall(f"{left} {right}")
    if any(occurrences.count(n) == 1 for n in set(occurrences)):
        return False   # (quick: a name used once cannot cancel out; most guards are like `s3 >= 0`)
    try:
        diff = ast.parse(f"({left}) - ({right})", mode="eval").body
    except SyntaxError:
        return False
    names = set()
    for node in ast.walk(diff):
        if isinstance(node, ast.Name):
            if node.id not in int_names:
                return False
            names.add(node.id)
        elif isinstance(node, ast.Constant):
            if type(node.value) is not int:
                return False
        elif not isinstance(node, (ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.expr_context)) or (
                isinstance(node, ast.operator) and not isinstance(node, ARITHMETIC)) or (
                isinstance(node, ast.unaryop) and not isinstance(node, ast.USub)):
            return False
    code = compile(ast.Expression(diff), "<guard>", "eval")
    rng = random.Random(len(left) + len(right))
    values = {eval(code, {"__builtins__": {}}, {n: rng.randint(-10**9, 10**9) for n in names}) for _ in range(4)}
    return len(values) == 1 and _COMPARE[symbol](values.pop())

