"""Turning a generative judge's text into a reward: the contract, and parsers for common forms.

The contract of ``g.judge(name, model=..., pool=..., template=..., parse=..., max_tokens=...)``:

``template(**fields)``
    gets every field of the sample by name — ``prompt`` (as the source gave it: a string, or
    the list of chat messages of a prompt file's row), ``answer``, ``response`` (the policy's
    decoded text; for a tool-calling stage its last turn, ``trajectory`` the whole), and every
    other column of the prompt file — and returns the judge's prompt as either

    * a **string**: encoded as is by the *judge's* tokenizer (with what its post-processor adds
      to a raw prompt, e.g. Llama 3's BOS), or
    * a **list of chat messages** (``[{"role": "user", "content": ...}]``): rendered with the
      *judge's* chat template (``add_generation_prompt=True``), then encoded.

``parse(verdict, **fields)``
    gets ``verdict``, the judge's generated text decoded by the judge's tokenizer (special
    tokens such as ``<|im_end|>`` left out; the prompt not included), plus the same fields, and
    returns the reward as a number, or **None** when the text holds no verdict. None is a
    failed judgement: the sample's ``reward`` is None and ``judge_failed`` True, and the run
    counts it (``judge_failures`` in summary.json); it is never read as 0. A ``bool`` is not a
    reward (return 1.0 / 0.0).

``max_tokens``
    The judge decodes greedily until its EOS (or any stop token of its generation_config) or
    ``max_tokens`` tokens. A verdict cut short usually parses to None, so give it room: a BPE
    token is about 3-4 characters of English, ``\\boxed{7}`` takes about 5 tokens, "Score: 7/10"
    about 6, and a judge that reasons first (Qwen3's ``<think>`` blocks) needs hundreds to
    thousands. The built-in judge writes "85:Yes" (``max_tokens=8``).

The parsers here take the judge's text and return a float or None, and each has a ready
``parse_*`` form to pass as ``parse=`` directly. Every one first drops a reasoning block
(``strip_thinking``): the verdict is what follows the last ``</think>``, and a ``<think>``
that never closed (cut off by ``max_tokens``) is no verdict at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Parse = Callable[..., float | None]  # parse(verdict, **fields) -> reward or None

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
YES_WORDS = frozenset({"yes", "true", "correct", "right"})
NO_WORDS = frozenset({"no", "false", "incorrect", "wrong"})
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
# (one run of spaces between each part and the next: three \s* side by side backtracked
# cubically on "score" and a long run of spaces, as a degenerate judge may write)
_SCORE = re.compile(rf"\b(score|rating|grade)\s*(?:[:=]\s*)?(?:\*+\s*)?({_NUMBER})"
                    rf"(?:\s*/\s*({_NUMBER}))?", re.IGNORECASE)
_TEXT_WRAP = re.compile(r"^\\(?:text|textbf|mathrm|mbox)\{(.*)\}$", re.DOTALL)


def strip_thinking(text: str) -> str | None:
    """The text after the last ``</think>``; None when a ``<think>`` is still open (the judge
    was cut off while reasoning); the text itself when there is no reasoning block."""
    close = text.rfind(THINK_CLOSE)
    if close != -1:
        return text[close + len(THINK_CLOSE):]
    return None if THINK_OPEN in text else text


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` whose braces close (balanced inside it), or
    None. One pass pairs every brace (a scan from each unclosed box to the end, as before,
    took quadratic time: hours on a long verdict of unclosed boxes)."""
    if "\\boxed{" not in text:
        return None
    closes: dict[int, int] = {}  # an opening brace's index -> its closing brace's
    opened: list[int] = []
    for i, c in enumerate(text):
        if c == "{":
            opened.append(i)
        elif c == "}" and opened:
            closes[opened.pop()] = i
    start = text.rfind("\\boxed{")
    while start != -1:
        brace = start + len("\\boxed")
        if brace in closes:
            return text[brace + 1:closes[brace]]
        start = text.rfind("\\boxed{", 0, start)  # unclosed: an earlier one may be whole
    return None


def boxed(text: str) -> float | None:
    """``\\boxed{...}`` holding a number (``\\boxed{7}`` -> 7.0, ``\\boxed{0.5}`` -> 0.5) or a
    yes/no word (``\\boxed{Yes}``, ``\\boxed{\\text{no}}``, true/false, correct/incorrect ->
    1.0/0.0); the last box counts. None for no box or anything else in it."""
    body = strip_thinking(text)
    inner = last_boxed(body) if body is not None else None
    if inner is None:
        return None
    inner = inner.strip()
    while (m := _TEXT_WRAP.match(inner)) is not None:
        inner = m.group(1).strip()
    word = inner.strip(" .!").lower()
    if word in YES_WORDS:
        return 1.0
    if word in NO_WORDS:
        return 0.0
    return float(inner) if re.fullmatch(_NUMBER, inner) else None


def yes_no(text: str) -> float | None:
    """The last "Yes" or "No" as a whole word, in any case: 1.0 / 0.0 ("Is it right? ...
    the answer is wrong, so: no." -> 0.0); None when neither word appears."""
    body = strip_thinking(text)
    words = _YES_NO.findall(body) if body is not None else []
    if not words:
        return None
    return 1.0 if words[-1].lower() == "yes" else 0.0


def score(text: str, *, scale: float | None = None) -> float | None:
    """The last "Score: X", "Rating: X" or "Grade: X" (any case; ``=`` or no colon too; an
    optional "/ Y"): "Score: 7/10" -> 0.7, "Rating: 0.8" -> 0.8, "score = 4 / 5" -> 0.8. Without
    "/ Y" the value is divided by ``scale`` when given ("Score: 7" with scale=10 -> 0.7). None
    when there is no score, or it is out of range (below 0, or above its maximum)."""
    body = strip_thinking(text)
    found = _SCORE.findall(body) if body is not None else []
    if not found:
        return None
    _, value_s, top_s = found[-1]
    value = float(value_s)
    top = float(top_s) if top_s else scale
    if top is None:
        return value if value >= 0 else None
    if top <= 0 or not 0 <= value <= top:
        return None
    return value / top


def first_of(*parsers: Callable[[str], float | None]) -> Parse:
    """A ``parse`` trying each parser in turn, e.g. ``first_of(boxed, yes_no)``: the first
    that finds a verdict gives the reward."""
    def parse(verdict: str, **_: object) -> float | None:
        for p in parsers:
            reward = p(verdict)
            if reward is not None:
                return reward
        return None
    return parse


def score_parser(scale: float | None = None) -> Parse:
    """``parse`` for scores, e.g. ``score_parser(10)`` for a judge told to score out of 10."""
    def parse(verdict: str, **_: object) -> float | None:
        return score(verdict, scale=scale)
    return parse


def parse_boxed(verdict: str, **_: object) -> float | None:
    """``boxed`` as a judge's ``parse``."""
    return boxed(verdict)


def parse_yes_no(verdict: str, **_: object) -> float | None:
    """``yes_no`` as a judge's ``parse``."""
    return yes_no(verdict)


def parse_score(verdict: str, **_: object) -> float | None:
    """``score`` (no scale: "X/Y" or a bare value) as a judge's ``parse``."""
    return score(verdict)
