"""Built-in tools. ``calculator`` evaluates arithmetic safely (an AST walk, never ``eval``)."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import cast

from pivotflow.tools.registry import tool

MAX_EXPRESSION_CHARS = 256
MAX_INT_BITS = 4096  # bigger operands could make one ``**`` or ``*`` run for minutes
MAX_EXPONENT = 1024

_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[float], float]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _check_size(value: float, expression: str) -> float:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ValueError(f"result too large (over {MAX_INT_BITS} bits) in {expression!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"result is not a finite number in {expression!r}")
    return value


def _eval(node: ast.AST, expression: str) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body, expression)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return cast(float, node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, expression))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, expression), _eval(node.right, expression)
        if isinstance(node.op, ast.Pow):
            if abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is over {MAX_EXPONENT} in {expression!r}")
            if isinstance(left, int) and left.bit_length() * abs(right) > MAX_INT_BITS + 64:
                raise ValueError(f"result too large (over {MAX_INT_BITS} bits) in {expression!r}")
        try:
            return _check_size(_BINARY[type(node.op)](left, right), expression)
        except OverflowError:
            raise ValueError(f"result too large in {expression!r}") from None
    what = type(node).__name__
    raise ValueError(
        f"unsupported syntax {what} in {expression!r}: only numbers, + - * / // % ** "
        "and parentheses are allowed"
    )


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression.

    Raises ValueError for anything but numbers, + - * / // % ** and parentheses, for an
    expression over MAX_EXPRESSION_CHARS, or a result too large; ZeroDivisionError for x/0.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(
            f"expression is {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}"
        )
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r} ({exc.msg})") from None
    return _eval(tree, expression)


def format_number(value: float) -> str:
    """Integers exactly; floats to 12 significant digits, integral ones without a '.0'."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.12g}"


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(12 + 7) * 31".
    """
    return format_number(evaluate(expression))
