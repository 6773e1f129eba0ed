"""Prompt files: JSONL or Parquet rows, one prompt each, whose other columns become sample fields.

A row needs a prompt (``prompt_key``: a non-empty string, or a list of chat messages
``[{"role": "user", "content": ...}]`` that the model's chat template renders) and, unless
``answer_key`` is None, an answer (a string, or a number written as one). Every other column
reaches the stage functions by name, as a dataset's columns reach a reward function in TRL: a row
``{"prompt": "2+2=", "answer": "4", "level": 3}`` lets ``def reward(completion, level, **_)``
read ``level``. All rows have the same columns. ``answer_key`` may reach into a struct column
with dots, as verl's datasets hold the answer (``reward_model.ground_truth``: the column
``reward_model`` is ``{"style": "rule", "ground_truth": "72"}``); the column stays a field too.
Parquet needs pyarrow (``pip install 'pivotflow[parquet]'``), imported only to read one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from pivotflow.errors import TaskError
from pivotflow.messages import message_problem

SUFFIXES = (".jsonl", ".parquet")


@dataclass(frozen=True, slots=True)
class PromptTable:
    """The rows of a prompt file, each ``{"prompt", "answer", *columns}``."""

    path: Path
    rows: list[dict[str, Any]]
    columns: tuple[str, ...]  # the other columns, sorted: the fields they become


def load_prompt_file(path: str | Path, *, prompt_key: str = "prompt",
                     answer_key: str | None = "answer",
                     reserved: frozenset[str] = frozenset()) -> PromptTable:
    """Read and check every row. ``reserved``: field names the runtime writes, which a column
    may not take. Raises TaskError naming the file, the row (line for JSONL) and the column."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise TaskError(f"{path}: prompt files are {' or '.join(SUFFIXES)}, not "
                        f"{path.suffix or 'a file without a suffix'!r}")
    if not path.is_file():
        raise TaskError(f"{path}: no such prompt file")
    raw = _read_parquet(path) if path.suffix == ".parquet" else _read_jsonl(path)
    if not raw:
        raise TaskError(f"{path}: no rows")
    where = "line" if path.suffix == ".jsonl" else "row"
    keys = set(raw[0][1])
    columns = tuple(sorted(keys - {prompt_key, answer_key}))  # (a dotted answer's column stays)
    _check_columns(path, columns, reserved)
    rows = []
    for n, row in raw:
        if set(row) != keys:
            extra, missing = sorted(set(row) - keys), sorted(keys - set(row))
            raise TaskError(f"{path}:{where} {n}: columns differ from the first row's "
                            f"(extra {extra}, missing {missing})")
        rows.append(_row(path, f"{where} {n}", row, prompt_key, answer_key, columns))
    return PromptTable(path, rows, columns)


def _row(path: Path, where: str, row: dict[str, Any], prompt_key: str,
         answer_key: str | None, columns: tuple[str, ...]) -> dict[str, Any]:
    prompt = row.get(prompt_key)
    if isinstance(prompt, list):  # chat messages, as verl's and TRL's datasets hold them
        problem = message_problem(prompt)
        if problem is not None:
            raise TaskError(f"{path}:{where}: the prompt column {prompt_key!r}: {problem}")
    elif not isinstance(prompt, str) or not prompt:
        shown = repr(prompt) if len(repr(prompt)) <= 40 else repr(prompt)[:37] + "..."
        got = "no such column" if prompt_key not in row else f"{type(prompt).__name__} {shown}"
        raise TaskError(f"{path}:{where}: the prompt column {prompt_key!r} must be a non-empty "
                        f"string ({got}; columns: {sorted(row)}) or a list of chat messages")
    answer: str | None = None
    if answer_key is not None:
        value, missing = _dig(row, answer_key)
        if missing is None and (isinstance(value, bool)
                                or not isinstance(value, str | int | float)):
            missing = type(value).__name__
        if missing is not None:
            raise TaskError(f"{path}:{where}: the answer column {answer_key!r} must be a string "
                            f"or a number ({missing}); give answer_key=None for prompts without "
                            "one")
        answer = value if isinstance(value, str) else str(value)
    return {**{c: row[c] for c in columns}, "prompt": prompt, "answer": answer}


def _dig(row: dict[str, Any], key: str) -> tuple[Any, str | None]:
    """``row[key]``, or for a dotted key that is no column, the path into struct columns
    (``reward_model.ground_truth``); (value, None), or (None, what is missing)."""
    if key in row or "." not in key:
        return row.get(key), None if key in row else "no such column"
    value: Any = row
    for depth, part in enumerate(key.split(".")):
        if not isinstance(value, dict) or part not in value:
            return None, ("no such column" if depth == 0 else
                          f"no {part!r} in {'.'.join(key.split('.')[:depth])!r}")
        value = value[part]
    return value, None


def _check_columns(path: Path, columns: tuple[str, ...], reserved: frozenset[str]) -> None:
    for c in columns:
        if not c.isidentifier() or c.startswith("_"):
            raise TaskError(f"{path}: column {c!r} cannot be a sample field (a field is a "
                            "Python name that does not start with '_')")
        if c in reserved:
            raise TaskError(f"{path}: column {c!r} is a field the runtime writes; rename it "
                            f"(reserved: {', '.join(sorted(reserved))})")


def jsonl_lines(path: Path, what: str) -> list[tuple[int, bytes]]:
    """(1-based line number, line) of every non-blank line; raises TaskError naming ``what``
    (a "dataset", a "prompt file") and the path if it cannot be read."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise TaskError(f"cannot read {what} {path}: {exc}") from None
    return [(n, line) for n, line in enumerate(lines, 1) if line.strip()]


def _read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for n, line in jsonl_lines(path, "prompt file"):
        try:
            row = msgspec.json.decode(line)
        except msgspec.DecodeError as exc:
            raise TaskError(f"{path}:line {n}: not JSON: {exc}") from None
        if not isinstance(row, dict):
            raise TaskError(f"{path}:line {n}: a row is a JSON object, got "
                            f"{type(row).__name__}")
        out.append((n, row))
    return out


def _read_parquet(path: Path) -> list[tuple[int, dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskError(f"reading {path} needs pyarrow: pip install 'pivotflow[parquet]'") \
            from None
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise TaskError(f"{path}: not a readable Parquet file: {exc}") from None
    return list(enumerate(table.to_pylist(), 1))
