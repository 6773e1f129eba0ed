"""The task interface, the task registry, and deterministic datasets of problems (JSONL on disk).

A task makes problems (a prompt and its true answer) and checks a completion by an exact rule.
The rule, not a judge, is what ``task_accuracy`` in a run's metrics counts.
"""

from __future__ import annotations

import importlib
import inspect
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec

from pivotflow.errors import TaskError
from pivotflow.tasks.datasets import jsonl_lines


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """One verifiable problem: the text the policy continues, and the exact expected answer."""

    prompt: str
    answer: str
    meta: dict[str, Any] = {}


class Task(Protocol):
    """A verifiable task: samples problems and checks completions by an exact rule."""

    @property
    def name(self) -> str: ...

    def sample(self, rng: random.Random) -> Problem:
        """Draw one problem; all randomness comes from ``rng`` so a seed fixes the result."""
        ...

    def check(self, problem: Problem | str, completion: str) -> bool:
        """Whether ``completion`` (text, EOS already removed) answers ``problem`` (or an answer
        string) exactly."""
        ...


# name -> "module:attribute" of a factory taking the task's options as keyword arguments. Kept as
# an explicit table (no import-time self-registration) so `get_task` never depends on what
# happened to be imported.
_BUILTIN: dict[str, str] = {"arithmetic": "pivotflow.tasks.arithmetic:ArithmeticTask"}
_EXTRA: dict[str, Callable[..., Task]] = {}


def register_task(name: str, factory: Callable[..., Task]) -> None:
    """Make ``get_task(name, **options)`` call ``factory(**options)``.

    Raises TaskError if ``name`` is already taken.
    """
    if name in _BUILTIN or name in _EXTRA:
        raise TaskError(f"task name {name!r} is already registered")
    _EXTRA[name] = factory


def task_names() -> list[str]:
    """Every name `get_task` accepts, sorted."""
    return sorted([*_BUILTIN, *_EXTRA])


def get_task(name: str, **options: Any) -> Task:
    """Build the task registered as ``name`` with ``options``.

    Raises TaskError for an unknown name, an option the task does not take, or a bad value.
    """
    factory = _EXTRA.get(name)
    if factory is None:
        target = _BUILTIN.get(name)
        if target is None:
            raise TaskError(f"unknown task {name!r}; known tasks: {', '.join(task_names())}")
        module, attr = target.split(":")
        factory = getattr(importlib.import_module(module), attr)
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as exc:
        raise TaskError(f"task {name!r} does not accept options {sorted(options)}: {exc}") from None
    return factory(**options)


def make_dataset(task: Task, n: int, seed: int) -> list[Problem]:
    """``n`` problems with distinct prompts, the same for the same task, ``n`` and ``seed``.

    Raises TaskError if ``n`` is negative or the task cannot yield ``n`` distinct prompts.
    """
    if n < 0:
        raise TaskError(f"dataset size must be >= 0, got {n}")
    rng = random.Random(seed)
    seen: dict[str, Problem] = {}
    # Distinct prompts keep a held-out split honest; the attempt cap turns a too-small problem
    # space into an error instead of an endless loop.
    for _ in range(20 * n + 1000):
        if len(seen) == n:
            break
        problem = task.sample(rng)
        seen.setdefault(problem.prompt, problem)
    if len(seen) < n:
        raise TaskError(f"task {task.name!r} gave only {len(seen)} distinct prompts; asked for {n}")
    return list(seen.values())


def split_dataset(
    problems: Sequence[Problem], held_out: float | int, seed: int = 0
) -> tuple[list[Problem], list[Problem]]:
    """Split into (train, held_out), disjoint by prompt: no held-out prompt occurs in train.

    ``held_out`` is a fraction in (0, 1) or a count. Raises TaskError if it is out of range.
    """
    prompts = sorted({p.prompt for p in problems})
    if isinstance(held_out, float):
        if not 0.0 < held_out < 1.0:
            raise TaskError(f"held_out fraction must be in (0, 1), got {held_out}")
        k = max(1, round(held_out * len(prompts)))
    else:
        k = held_out
    if not 0 <= k <= len(prompts):
        raise TaskError(f"held_out count {k} is outside 0..{len(prompts)} distinct prompts")
    chosen = set(random.Random(seed).sample(prompts, k))
    train = [p for p in problems if p.prompt not in chosen]
    held = [p for p in problems if p.prompt in chosen]
    return train, held


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Problem)


def save_jsonl(problems: Iterable[Problem], path: str | Path) -> None:
    """Write one ``{"prompt":..,"answer":..,"meta":..}`` object per line."""
    with Path(path).open("wb") as f:
        for p in problems:
            f.write(_encoder.encode(p) + b"\n")


def load_jsonl(path: str | Path) -> list[Problem]:
    """Read problems written by `save_jsonl` (``meta`` optional; blank lines skipped).

    Raises TaskError naming the file and the 1-based line number of the first bad line, or the
    file if it cannot be read.
    """
    out = []
    for lineno, line in jsonl_lines(Path(path), "dataset"):
        try:
            out.append(_decoder.decode(line))
        except msgspec.DecodeError as exc:
            raise TaskError(f"{path}:{lineno}: not a problem record: {exc}") from None
    return out
