"""A math response's final answer, taken out and compared with the reference, without sympy.

What verl's ``math``/``math_dapo``/``gsm8k`` scorers, TRL's ``accuracy_reward`` (math-verify)
and slime's ``deepscaler`` reward do, in three steps:

* ``final_answer(text, style)``: the answer the response states: the last ``\\boxed{...}``
  (``"boxed"``), the text after GSM8K's ``####`` (``"gsm8k"``), the last ``Answer: ...`` line
  (``"answer"``, DAPO's and Minerva's), the last number (``"last_number"``, verl's "flexible"
  GSM8K mode), or the first of the first three found (``"auto"``). A reference answer goes
  through ``reference_answer``: a MATH solution's box or a GSM8K solution's ``####`` where it
  has one, else the whole text.
* ``normalized(answer)``: LaTeX spacing, ``\\left``/``\\right``, ``\\dfrac``, ``$``, degrees,
  units and ``\\text{...}`` words after a number, a leading ``x =`` or ``x \\in``, ``\\text{and}``
  between answers, thousands separators, a multiple-choice letter's brackets, a trailing
  period: the forms that say the same answer.
* ``equivalent(pred, gold, leaf)``: the two answers' structure compared (a tuple or interval's
  brackets and items in order, a set's or a bare list's items in any order, ``a \\pm b`` as
  its two answers, an equation's sides, an inequality's once both face the same way, a
  matrix's cells whatever its brackets), each pair of items by ``leaf``. ``plain_leaf``
  decides what needs no algebra: the same normalized text, or two numbers (integers,
  decimals, fractions, ``\\frac{a}{b}``, mixed numbers, percentages) within a relative
  1e-6; it answers None where only algebra can say
  (``\\frac{\\sqrt{2}}{2}`` against ``\\sqrt{2}/2``), and ``math_checker`` (a process of its
  own, under a time limit: sympy can run for ever) decides those with ``latex_expr``.

Nothing here evaluates the model's text as code: numbers are read with ``Fraction``, and the
algebra builds sympy expressions from parsed tokens (``latex_expr``), never ``sympify``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

STYLES = ("auto", "boxed", "gsm8k", "answer", "last_number")
Leaf = Callable[[str, str], "bool | None"]

_GSM8K = re.compile(r"####\s*([^\n]+)")
# (one run of spaces before the colon: "answer" and 100k spaces with no colon must not take
# quadratic time on the controller's loop, which two runs of \s* around "is" did)
_ANSWER_LINE = re.compile(r"(?i)\banswer(?:\s+is)?\s*:[ \t]*([^\n]+)")
_NUMBER_IN_TEXT = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def final_answer(text: str, style: str = "auto") -> str | None:
    """The answer ``text`` states in ``style`` (``STYLES``), or None where it states none."""
    if style not in STYLES:
        raise ValueError(f"math answer style must be one of {', '.join(STYLES)}, got {style!r}")
    if style in ("auto", "boxed"):
        boxed = last_boxed(text)
        if boxed is not None or style == "boxed":
            return boxed
    if style in ("auto", "gsm8k"):
        found = _GSM8K.findall(text)
        if found or style == "gsm8k":
            return found[-1].strip() if found else None
    if style in ("auto", "answer"):
        found = _ANSWER_LINE.findall(text)
        return found[-1].strip() if found else None
    numbers = [n for n in _NUMBER_IN_TEXT.findall(text) if n.strip("-,.")]
    return numbers[-1].rstrip(",") if numbers else None


def reference_answer(text: str) -> str:
    """A dataset's answer as the reference: a worked solution's box or ``####`` answer where it
    has one (MATH's and GSM8K's ``solution`` columns), else the whole text."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    found = _GSM8K.findall(text)
    return found[-1].strip() if found else text.strip()


def last_boxed(text: str) -> str | None:
    """What the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``) holds, braces
    balanced; None where there is none, or its braces never close (a response cut short)."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    if text.startswith(" ", i):  # \boxed 5: one word
        word = text[i:].split(None, 1)
        return word[0].rstrip("$.") if word else None
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j].strip()
    return None


# --- normalizing ----------------------------------------------------------------------------

_SPACING = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\quad", "\\qquad",
            "\\displaystyle", "\\limits", "~")
_UNWRAPPED = re.compile(r"\\(?:mathrm|mathbf|textbf|mathit|mbox|text|textit|operatorname)"
                        r"\s*\{([^{}]*)\}")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\degree")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_CHOICE = re.compile(r"^\(?([A-Ea-e])\)?\.?$")
# units a number is given in (DAPO's and Minerva's lists, and the usual others)
_UNITS = ("cm|mm|km|m|meters?|inch(?:es)?|feet|foot|ft|miles?|mph|hours?|minutes?|seconds?|days?"
          "|weeks?|years?|dollars?|cents?|pounds?|units?|degrees?|square|sq|ways|points|edges"
          "|students|people|digits|integers|multiples|meals|gm|kg|grams?|liters?")
_UNIT_AFTER_NUMBER = re.compile(
    rf"^(-?[\d.,/]+%?)\s*(?:\\(?:text|mbox|mathrm)\{{[^{{}}]*\}}|(?:{_UNITS})\b)(?:\^\{{?[23]\}}?)?$")
_LEADING_NAME = re.compile(r"^(?:[A-Za-z](?:_\{?\w+\}?)?|\\[a-z]+|\\text\{[^{}]*\})\s*=(?!=)")


def normalized(answer: str) -> str:
    """``answer`` in the one form each of its spellings reaches (the module's docstring)."""
    s = answer.strip()
    for a, b in (("\\(", ""), ("\\)", ""), ("\\[", ""), ("\\]", "")):
        s = s.replace(a, b)
    s = s.strip().strip("$").strip()
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for space in _SPACING:
        s = s.replace(space, " " if space in ("\\quad", "\\qquad", "~") else "")
    s = s.replace("\\$", "").replace("{,}", ",").replace("\\%", "%")
    s = _DEGREES.sub("", s)
    unit = _UNIT_AFTER_NUMBER.match(s.strip())
    if unit:  # "5 cm", "12\text{ inches}", "3 dollars": the number alone
        s = unit.group(1)
    s = _LEADING_NAME.sub("", s.strip()) if s.count("=") == 1 else s
    s = re.sub(r"^[A-Za-z]\s*\\in\s*", "", s)  # "x \in [0, 1)": the interval
    # "1 \text{ and } 2", "3, \text{or} 4": a list of answers
    s = re.sub(r",?\s*\\(?:text|mbox)\{\s*(?:and|or)\s*\}\s*", ",", s)
    s = _UNWRAPPED.sub(lambda m: m.group(1), s)
    s = re.sub(r"(?<!\\)\\ ", " ", s)  # "\ " a space, but a matrix's row break "\\ " kept
    # spaces go, but one between two letters or digits, where TeX needs it (\log_2 8, \sin x)
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"(?<![A-Za-z0-9]) | (?![A-Za-z0-9])", "", s).rstrip(".")
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    choice = _CHOICE.match(s)
    if choice:
        s = choice.group(1).upper()
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)  # \frac12 as TeX reads it
    s = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s)
    return s


# --- numbers --------------------------------------------------------------------------------

_DECIMAL = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d{1,3})?$")
_SLASH = re.compile(r"^([-+]?\d+)/(\d+)$")
_FRAC = re.compile(r"^([-+]?)\\frac\{([-+]?\d+)\}\{(\d+)\}$")
_MIXED = re.compile(r"^([-+]?)(\d+)\\frac\{(\d+)\}\{(\d+)\}$")


def number_of(s: str) -> Fraction | None:
    """``s`` (normalized) as an exact number where it is one written plainly (an integer, a
    decimal, ``a/b``, ``\\frac{a}{b}``, a mixed number ``2\\frac{1}{2}``), else None. A
    percentage is not read here (``plain_leaf`` weighs it both ways)."""
    if len(s) > 64:  # no number worth reading this way is longer; keeps Fraction cheap
        return None
    if _DECIMAL.match(s):
        return Fraction(s)
    for pattern in (_SLASH, _FRAC):
        m = pattern.match(s)
        if m:
            *sign, top, bottom = m.groups()
            if int(bottom) == 0:
                return None
            value = Fraction(int(top), int(bottom))
            return -value if sign and sign[0] == "-" else value
    m = _MIXED.match(s)
    if m and int(m.group(4)) != 0:
        value = int(m.group(2)) + Fraction(int(m.group(3)), int(m.group(4)))
        return -value if m.group(1) == "-" else value
    return None


def close(a: Fraction, b: Fraction) -> bool:
    """Equal within a relative 1e-6 of the reference (0.3333333 is 1/3; 0.333 is not)."""
    return a == b or abs(a - b) <= Fraction(1, 10**6) * max(Fraction(1), abs(b))


def plain_leaf(pred: str, gold: str) -> bool | None:
    """Two normalized items the same without algebra: True or False where text or numbers
    say, None where only algebra can."""
    if pred == gold or (pred.isalpha() and gold.isalpha() and pred.casefold() == gold.casefold()):
        return True
    p_pct, g_pct = pred.endswith("%"), gold.endswith("%")
    p, g = number_of(pred.rstrip("%")), number_of(gold.rstrip("%"))
    if p is not None and g is not None:
        if p_pct == g_pct:
            return close(p, g)
        # "50%" for 50 or for 0.5: either reading is the same answer
        return close(p, g) or close(p / 100 if p_pct else p, g / 100 if g_pct else g)
    if _words(pred) or _words(gold):
        return False
    if (p is None) != (g is None) and not _algebra(pred if p is None else gold):
        return False
    return None


def _words(s: str) -> bool:
    """Plain words (``yes``, ``Monday``): compared as text, never as algebra."""
    return bool(re.fullmatch(r"[A-Za-z]{2,}", s)) and not s.startswith(("sqrt", "pi"))


_ALGEBRA = re.compile(r"[\\^*/()!|{a-zA-Z]|\d\s*[-+]")


def _algebra(s: str) -> bool:
    """Whether ``s`` might be an expression for a number (so only algebra can compare it)."""
    return bool(_ALGEBRA.search(s))


# --- structure ------------------------------------------------------------------------------

_OPEN = {"(": ")", "[": "]", "\\{": "\\}"}


def split_top(s: str, sep: str = ",") -> list[str]:
    """``s`` cut at each ``sep`` outside brackets and braces."""
    parts, depth, start = [], 0, 0
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\" and s[i + 1:i + 2] in ("{", "}"):
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(s[start:i])
            start = i + 1
        i += 1
    parts.append(s[start:])
    return parts


def _bracketed(s: str) -> tuple[str, list[str], str] | None:
    """``(a,b)``, ``[a,b)``, ``\\{a,b\\}``: its brackets and items, where the brackets hold
    the whole of ``s`` and it has more than one item."""
    for opening, closing in (("\\{", "\\}"), ("(", ")"), ("[", "]"), ("(", "]"), ("[", ")")):
        if s.startswith(opening) and s.endswith(closing) and len(s) > len(opening + closing):
            inner = s[len(opening):-len(closing)]
            if _balanced(inner):
                items = split_top(inner)
                if len(items) > 1:
                    return opening, items, closing
    return None


def _balanced(s: str) -> bool:
    depth = 0
    for c in s.replace("\\{", "{").replace("\\}", "}"):
        depth += c in "([{"
        depth -= c in ")]}"
        if depth < 0:
            return False
    return depth == 0


_MATRIX = re.compile(r"^\\begin\{([pbvBV]?matrix)\}(.*)\\end\{\1\}$", re.DOTALL)


def _matrix(s: str) -> list[list[str]] | None:
    """A ``\\begin{pmatrix} a & b \\\\ c & d \\end{pmatrix}``'s cells by row (any of
    the matrix environments: the brackets do not change the answer), else None."""
    m = _MATRIX.match(s)
    if m is None:
        return None
    rows = [row for row in m.group(2).split("\\\\") if row.strip()]
    return [[cell.strip() for cell in row.split("&")] for row in rows]


def equivalent(pred: str, gold: str, leaf: Leaf = plain_leaf) -> bool | None:
    """``pred`` and ``gold`` (both normalized) the same answer: True, False, or None where a
    ``leaf`` could not say."""
    if pred == gold:
        return True
    if not pred or not gold:
        return False
    gm, pm = _matrix(gold), _matrix(pred)
    if gm is not None or pm is not None:
        if gm is None or pm is None or [len(r) for r in gm] != [len(r) for r in pm]:
            return False
        return _all(leaf_pair(a, b, leaf) for p_row, g_row in zip(pm, gm, strict=True)
                    for a, b in zip(p_row, g_row, strict=True))
    g, p = _bracketed(gold), _bracketed(pred)
    if g is not None or p is not None:
        if g is None or p is None or (g[0], g[2]) != (p[0], p[2]) or len(g[1]) != len(p[1]):
            return False if g is not None and p is not None else _leaf_or_list(pred, gold, leaf)
        if g[0] == "\\{":
            return _unordered(p[1], g[1], leaf)
        return _all(leaf_pair(a, b, leaf) for a, b in zip(p[1], g[1], strict=True))
    return _leaf_or_list(pred, gold, leaf)


def _leaf_or_list(pred: str, gold: str, leaf: Leaf) -> bool | None:
    g_items, p_items = _plus_minus(split_top(gold)), _plus_minus(split_top(pred))
    if len(g_items) > 1 or len(p_items) > 1:
        # "1, 2" or "1 \text{and} 2": a bare list of answers (MATH's "all solutions") in
        # any order
        if len(g_items) != len(p_items):
            return False
        return _unordered(p_items, g_items, leaf)
    return leaf_pair(pred, gold, leaf)


def _plus_minus(items: list[str]) -> list[str]:
    """``1 \\pm \\sqrt{2}`` as the two answers it stands for."""
    out = []
    for item in items:
        if item.count("\\pm") == 1:
            out += [item.replace("\\pm", "+"), item.replace("\\pm", "-")]
        elif item.count("\\mp") == 1:
            out += [item.replace("\\mp", "-"), item.replace("\\mp", "+")]
        else:
            out.append(item)
    return out


_RELATION = re.compile(r"((?:\\leq?|\\geq?|\\lt|\\gt)(?![a-zA-Z])|<=|>=|<|>)")
_FLIPPED = {"<": "<", "\\lt": "<", "<=": "<=", "\\le": "<=", "\\leq": "<=",
            ">": ">", "\\gt": ">", ">=": ">=", "\\ge": ">=", "\\geq": ">="}


def _relation(s: str) -> tuple[str, str, str] | None:
    """``a < b`` as (a, "<" or "<=", b), ``a > b`` turned round to (b, "<", a); None where
    ``s`` is not one relation."""
    parts = _RELATION.split(s)
    if len(parts) != 3:
        return None
    left, op, right = parts[0].strip(), _FLIPPED[parts[1]], parts[2].strip()
    return (left, op, right) if op.startswith("<") else (right, op.replace(">", "<"), left)


def leaf_pair(pred: str, gold: str, leaf: Leaf) -> bool | None:
    """One item each; an equation's sides compared as they stand or swapped; an inequality's
    (``x > 3`` is ``3 < x``) as they stand once both face the same way."""
    p_rel, g_rel = _relation(pred), _relation(gold)
    if p_rel is not None or g_rel is not None:
        if p_rel is None or g_rel is None or p_rel[1] != g_rel[1]:
            return False
        return _all([leaf(p_rel[0], g_rel[0]), leaf(p_rel[2], g_rel[2])])
    if pred.count("=") == 1 and gold.count("=") == 1:
        (pl, pr), (gl, gr) = (map(str.strip, s.split("=")) for s in (pred, gold))
        straight = _all([leaf(pl, gl), leaf(pr, gr)])
        return True if straight else _any([straight, _all([leaf(pl, gr), leaf(pr, gl)])])
    if pred.count("=") != gold.count("="):
        return False
    return leaf(pred, gold)


def _unordered(pred: list[str], gold: list[str], leaf: Leaf) -> bool | None:
    """Each item of ``gold`` matched by one of ``pred`` (a greedy matching: answers' items are
    few and distinct)."""
    left = list(pred)
    unsure = False
    for g in gold:
        for i, p in enumerate(left):
            same = leaf_pair(p, g, leaf)
            if same:
                del left[i]
                break
            unsure = unsure or same is None
        else:
            if not unsure:
                return False
            return None
    return True


def _all(results: object) -> bool | None:
    seen = list(results)  # type: ignore[call-overload]
    if any(r is False for r in seen):
        return False
    return None if any(r is None for r in seen) else True


def _any(results: list[bool | None]) -> bool | None:
    if any(r is True for r in results):
        return True
    return None if any(r is None for r in results) else False
