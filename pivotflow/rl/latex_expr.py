"""A math answer's LaTeX (or plain ``2*x^2``) as a sympy expression, and two answers' algebra
compared: what ``math_checker`` runs for the items ``math_answer.plain_leaf`` cannot decide.

The parser is a small recursive descent over the notation answers are written in: numbers
(decimals kept exact), letters (``x_1`` and ``x_{12}`` one symbol each), Greek letters,
``\\pi``, ``\\infty``, ``+ - * / ^``, ``\\cdot``, ``\\times``, ``\\div``, ``\\pm`` (read as
``+``), implicit multiplication (``2x``, ``3\\sqrt{2}``, ``x(y+1)``), ``\\frac``, ``\\sqrt``
and ``\\sqrt[n]``, ``\\binom``, ``!``, ``|x|``, and ``\\sin``-style functions, ``\\log_b``,
``\\ln``, ``\\exp``. It builds the expression from its tokens: nothing the model wrote is ever
evaluated as Python (sympy's ``sympify`` would ``eval`` it). Anything else is ``NotMath``.
"""

from __future__ import annotations

import random
import re
from typing import Any

import sympy

from pivotflow.rl.math_answer import number_of, plain_leaf

_TOKEN = re.compile(r"\s*(\d+\.?\d*|\.\d+|\\[A-Za-z]+|\\[{}|]|[A-Za-z]|\*\*|[-+*/^_!(){}\[\]|,])")
_GREEK = {"alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta",
          "vartheta", "iota", "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau",
          "upsilon", "phi", "varphi", "chi", "psi", "omega", "Gamma", "Delta", "Theta", "Lambda",
          "Xi", "Sigma", "Phi", "Psi", "Omega"}
_FUNCTIONS: dict[str, Any] = {
    "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "cot": sympy.cot, "sec": sympy.sec,
    "csc": sympy.csc, "arcsin": sympy.asin, "arccos": sympy.acos, "arctan": sympy.atan,
    "sinh": sympy.sinh, "cosh": sympy.cosh, "tanh": sympy.tanh, "ln": sympy.log,
    "exp": sympy.exp,
}
_TIMES = {"*", "\\cdot", "\\times", "**"}
_ATOM_START = re.compile(r"\d|\.|[A-Za-z]|\\(?!cdot|times|div|pm|mp|right|\}|\|)|[({\[|]")


class NotMath(ValueError):
    """The text is not an expression this parser reads."""


def parse(text: str) -> sympy.Expr:
    """``text`` as a sympy expression; raises ``NotMath``."""
    tokens = _tokens(text)
    parser = _Parser(tokens)
    expr = parser.expression()
    if parser.i != len(tokens):
        raise NotMath(f"unexpected {tokens[parser.i]!r}")
    return expr


def _tokens(text: str) -> list[str]:
    out, i = [], 0
    text = text.strip()
    while i < len(text):
        m = _TOKEN.match(text, i)
        if m is None:
            if text[i:].strip() == "":
                break
            raise NotMath(f"cannot read {text[i:i + 10]!r}")
        out.append(m.group(1))
        i = m.end()
    return out


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, want: str | None = None) -> str:
        token = self.peek()
        if token is None or (want is not None and token != want):
            raise NotMath(f"expected {want or 'more'}, found {token!r}")
        self.i += 1
        return token

    def expression(self) -> sympy.Expr:
        sign = -1 if self.peek() == "-" else 1
        if self.peek() in ("-", "+"):
            self.take()
        value = sign * self.term()
        while self.peek() in ("+", "-", "\\pm", "\\mp"):
            op = self.take()
            right = self.term()
            value = value - right if op in ("-", "\\mp") else value + right
        return value

    def term(self) -> sympy.Expr:
        value = self.signed()
        while True:
            token = self.peek()
            if token in _TIMES:
                self.take()
                value = value * self.signed()
            elif token in ("/", "\\div"):
                self.take()
                value = value / self.signed()
            elif token is not None and _ATOM_START.match(token) and token != "|":
                value = value * self.power()  # implicit: 2x, 3\sqrt{2}, x(y+1)
            else:
                return value

    def signed(self) -> sympy.Expr:
        if self.peek() == "-":
            self.take()
            return -self.signed()
        if self.peek() == "+":
            self.take()
        return self.power()

    def power(self) -> sympy.Expr:
        base = self.postfix()
        if self.peek() in ("^", "**"):
            self.take()
            return base ** self.exponent()
        return base

    def exponent(self) -> sympy.Expr:
        if self.peek() == "{":
            return self.group("{", "}")
        if self.peek() == "-":
            self.take()
            return -self.postfix()
        return self.postfix()

    def postfix(self) -> sympy.Expr:
        value = self.atom()
        while self.peek() == "!":
            self.take()
            value = sympy.factorial(value)
        return value

    def group(self, opening: str, closing: str) -> sympy.Expr:
        self.take(opening)
        value = self.expression()
        self.take(closing)
        return value

    def argument(self) -> sympy.Expr:
        """A command's argument: ``{...}``, or one token (``\\frac12``, ``\\sqrt2``)."""
        if self.peek() == "{":
            return self.group("{", "}")
        return self.atom()

    def atom(self) -> sympy.Expr:
        token = self.peek()
        if token is None:
            raise NotMath("the expression ends early")
        if token[0].isdigit() or token[0] == ".":
            self.take()
            return sympy.Rational(token)  # exact: 0.1 is 1/10
        if token in ("(", "{", "["):
            return self.group(token, {"(": ")", "{": "}", "[": "]"}[token])
        if token == "|":
            self.take()
            value = self.expression()
            self.take("|")
            return sympy.Abs(value)
        if len(token) == 1 and token.isalpha():
            self.take()
            return sympy.Symbol(token + self.subscript())
        if token.startswith("\\"):
            return self.command(self.take()[1:])
        raise NotMath(f"unexpected {token!r}")

    def subscript(self) -> str:
        if self.peek() != "_":
            return ""
        self.take()
        if self.peek() == "{":
            self.take()
            parts = []
            while self.peek() not in ("}", None):
                parts.append(self.take())
            self.take("}")
            return "_" + "".join(parts)
        return "_" + self.take()

    def command(self, name: str) -> sympy.Expr:
        if name == "frac":
            top = self.argument()
            return top / self.argument()
        if name == "sqrt":
            if self.peek() == "[":
                degree = self.group("[", "]")
                return sympy.root(self.argument(), degree)
            return sympy.sqrt(self.argument())
        if name == "binom":
            n = self.argument()
            return sympy.binomial(n, self.argument())
        if name == "pi":
            return sympy.pi
        if name == "infty":
            return sympy.oo
        if name in _GREEK:
            return sympy.Symbol(name + self.subscript())
        if name == "log":
            base = None
            if self.peek() == "_":
                self.take()
                base = self.argument()
            arg = self.power()
            return sympy.log(arg) if base is None else sympy.log(arg, base)
        if name in _FUNCTIONS:
            exponent = None
            if self.peek() == "^":  # \sin^2 x
                self.take()
                exponent = self.exponent()
            value = _FUNCTIONS[name](self.power())
            return value if exponent is None else value ** exponent
        raise NotMath(f"unknown command \\{name}")


def same_value(pred: str, gold: str) -> bool:
    """Two items the same expression: their difference simplifies to 0, or (where sympy
    cannot simplify it) agrees at 0 to within 1e-9 at five random points; a trailing ``%``
    read both ways (50% is 50 or 0.5). Raises ``NotMath`` where either is not read."""
    p_pct, g_pct = pred.endswith("%"), gold.endswith("%")
    p, g = _read(pred.rstrip("%")), _read(gold.rstrip("%"))
    if p_pct == g_pct:
        return _same(p, g)
    return _same(p, g) or _same(p / 100 if p_pct else p, g / 100 if g_pct else g)


def _read(text: str) -> sympy.Expr:
    """A plain number exactly (``1.5e3`` included, which the parser would read as a product
    with ``e``), else the parsed expression."""
    number = number_of(text)
    return sympy.Rational(number.numerator, number.denominator) if number is not None \
        else parse(text)


def algebra_leaf(pred: str, gold: str) -> bool:
    """``math_answer.plain_leaf``, and algebra where it cannot say; an item the parser cannot
    read, or that sympy fails on, is not the same (the checker process's leaf)."""
    plain = plain_leaf(pred, gold)
    if plain is not None:
        return plain
    try:
        return same_value(pred, gold)
    except (MemoryError, RecursionError):
        raise
    except Exception:  # sympy's own errors on odd input are many: the answer is not read
        return False


def _same(p: sympy.Expr, g: sympy.Expr) -> bool:
    if p == g:
        return True
    if p.has(sympy.oo, -sympy.oo) or g.has(sympy.oo, -sympy.oo):
        return bool(sympy.simplify(p - g) == 0) if p.free_symbols | g.free_symbols else p == g
    diff = sympy.simplify(p - g)
    if diff == 0:
        return True
    symbols = sorted(diff.free_symbols, key=str)
    if not symbols:
        value = complex(sympy.N(diff, 30))
        scale = max(1.0, abs(complex(sympy.N(g, 30))))
        return abs(value) <= 1e-9 * scale
    draw = random.Random(0)
    for _ in range(5):
        point = {s: sympy.Rational(draw.randint(1, 97), draw.randint(1, 13)) for s in symbols}
        value = complex(sympy.N(diff.subs(point), 30))
        if abs(value) > 1e-9 * max(1.0, abs(complex(sympy.N(g.subs(point), 30)))):
            return False
    return True
