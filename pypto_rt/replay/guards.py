"""Guards: what a replay checks before it touches data, as `Guard` records in one normal form; `GUARD_MISS` when
one fails."""
from __future__ import annotations

import ast
import random
from dataclasses import dataclass

from pypto_rt.replay.scalars import TRACED, code_of, symbols_of

_NEGATED = {"==": "!=", "!=": "==", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}
_MIRRORED = {"==": "==", "!=": "!=", "<": ">", ">": "<", "<=": ">=", ">=": "<="}


class _GuardMiss:
    def __repr__(self):
        return "GUARD_MISS"


GUARD_MISS = _GuardMiss()   # what a replay returns when its guards do not hold: the call runs on the engine


@dataclass(frozen=True)
class Guard:
    """A check the replay makes before it touches data: `left op right` must hold (`left`, `right`: the code of
    numbers; `reads`: the values read from data or parameters they use)."""
    left: str
    op: str
    right: str
    reads: frozenset = frozenset()

    @staticmethod
    def of(left, op: str, right, outcome: bool) -> "Guard":
        """`left op right` (numbers, traced or plain) coming out as `outcome`, as a check that must hold, in one
        form (`s1 < 0` false is `s1 >= 0`; `0 <= s1` is `s1 >= 0`), so repeated checks are kept once."""
        if not outcome:
            op = _NEGATED[op]
        if type(left) not in TRACED and type(right) in TRACED:
            left, op, right = right, _MIRRORED[op], left
        return Guard(code_of(left), op, code_of(right), symbols_of(left) | symbols_of(right))

    def line(self) -> str:
        return f"if not ({self.left} {self.op} {self.right}): return _MISS"


ARITHMETIC = (ast.Add, ast.Sub, ast.Mult)   # integer arithmetic that cannot raise: safe before a guard
_COMPARE = {"==": lambda d: d == 0, "!=": lambda d: d != 0, "<": lambda d: d < 0, "<=": lambda d: d <= 0,
            ">": lambda d: d > 0, ">=": lambda d: d >= 0}


def holds_always(guard: Guard, int_names: set) -> bool:
    """Whether `guard` holds for any values of its names: both sides are +, -, * of integer names and integer
    constants (polynomials with integer values, exact), and their difference is the same constant at several
    random points (a nonzero polynomial is zero at random points with negligible chance)."""
    if not guard.reads or not guard.reads <= int_names:
        return False   # (quick: nothing read, or a float read from data)
    left, symbol, right = guard.left, guard.op, guard.right
    try:
        diff = ast.parse(f"({left}) - ({right})", mode="eval").body
    except SyntaxError:
        return False
    used = [node.id for node in ast.walk(diff) if isinstance(node, ast.Name)]
    if any(used.count(n) == 1 for n in set(used)):
        return False   # a name used once cannot cancel out (most guards are like `s3 >= 0`)
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

