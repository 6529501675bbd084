"""The Python source of a kernel function as an AST whose positions are the user's file:line:col.

Invariant: every node of `ParsedSource.tree` carries the line and column it has in the user's
file, so code compiled from it (and every error raised from it) points at the user's source.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass

from pypto_rt.errors import DSLError, Span
from pypto_rt.frontend.carried import bind_carried_results


@dataclass(frozen=True)
class ParsedSource:
    tree: ast.FunctionDef     # the function's definition, decorators removed
    file: str


def parse_function(fn) -> ParsedSource:
    """Parse `fn`'s definition; positions are shifted back to where it sits in its file."""
    try:
        lines, first_line = inspect.getsourcelines(fn)
    except (OSError, TypeError) as e:
        raise DSLError(f"cannot read the source of {fn.__qualname__}: {e}", None,
                       "PyPTO kernels must be defined in a .py file (not typed into a REPL or built with exec)"
                       ) from None
    raw = "".join(lines)
    text = textwrap.dedent(raw)
    indent = _indent_width(raw, text)
    module = ast.parse(text)
    func = module.body[0]
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise DSLError(f"{fn.__qualname__} is not a plain function definition", None)
    bind_carried_results(func)
    for node in ast.walk(module):
        if hasattr(node, "lineno"):
            node.lineno += first_line - 1
            node.end_lineno = (node.end_lineno or node.lineno) + first_line - 1
            node.col_offset += indent
            if node.end_col_offset is not None:
                node.end_col_offset += indent
    func.decorator_list = []
    return ParsedSource(func, fn.__code__.co_filename)


def _indent_width(raw: str, dedented: str) -> int:
    first = next((line for line in raw.splitlines() if line.strip()), "")
    first_dedented = next((line for line in dedented.splitlines() if line.strip()), "")
    return len(first) - len(first_dedented)


def span_of(file: str, node: ast.AST) -> Span:
    end = node.end_col_offset if getattr(node, "end_lineno", None) == node.lineno else None
    return Span(file, node.lineno, node.col_offset, end)
