"""What a run needs before workers start: models in the parameter store, tokenizers, prompts."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from pivotflow.errors import CheckpointError, GraphError
from pivotflow.graph import Graph, Node
from pivotflow.params.base import ParamStore
from pivotflow.tasks.registry import Problem, get_task
from pivotflow.tasks.tokenizer import CharTokenizer, default_tokenizer


@dataclass
class Models:
    tokenizers: dict[str, CharTokenizer] = field(default_factory=dict)
    dirs: dict[str, Path] = field(default_factory=dict)


def _tokenizer_of(model_dir: Path) -> CharTokenizer:
    path = model_dir / "tokenizer.json"
    if not path.exists():
        return default_tokenizer()
    import json

    try:
        return CharTokenizer.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable tokenizer: {exc}") from exc


def prepare_models(graph: Graph, store: ParamStore, *, seed: int,
                   console: Any = None) -> Models:
    """Resolve each declared model to a checkpoint (bootstrapping the built-in ones once) and
    publish it to the store as version 0."""
    from pivotflow.engines.torch.weights import load_checkpoint

    models = Models()
    builtin: tuple[Path, Path] | None = None
    for spec in graph.models.values():
        if spec.source.startswith("builtin:"):
            which = spec.source.split(":", 1)[1]
            if which not in ("policy", "judge", "tool_policy"):
                raise GraphError(f"model {spec.name!r} at {spec.where}: unknown built-in "
                                 f"{spec.source!r} (builtin:policy, builtin:judge or "
                                 "builtin:tool_policy)")
            if builtin is None:
                from pivotflow.tasks.cache import ensure_models

                builtin = ensure_models(seed=seed, progress=console is not False)
            path = builtin[0] if which == "policy" else builtin[1]
            if which == "tool_policy":  # the policy taught the calculator's call format
                from pivotflow.tasks.tool_policy import ensure_tool_policy

                path = ensure_tool_policy(seed=seed, progress=console is not False)
        else:
            path = Path(spec.source)
        config, tensors = load_checkpoint(path)
        if spec.context is not None:
            if spec.context < 2:
                raise GraphError(f"model {spec.name!r} at {spec.where}: context {spec.context} "
                                 "must be >= 2")
            config = msgspec.structs.replace(config, max_position_embeddings=spec.context)
        store.publish(spec.name, 0, tensors, config)
        models.tokenizers[spec.name] = _tokenizer_of(path)
        models.dirs[spec.name] = path
    return models


class ProblemStream:
    """The source's prompts: drawn from a task with a seed, or passed over a file's rows (each
    pass in a new order drawn from the seed and the pass, so ``cursor`` alone resumes it)."""

    def __init__(self, node: Node, *, seed: int) -> None:
        opts = node.options
        self.seed = seed
        self.rng = random.Random(seed)
        self.cursor = 0
        self.task = None
        self.rows: list[dict[str, Any]] = []
        self.shuffle = bool(opts.get("shuffle", True))
        self._order: tuple[int, list[int]] = (-1, [])  # (pass, row order)
        if opts["task"] is not None:
            self.task = get_task(opts["task"], **opts["task_options"])
        else:
            self.rows = opts["table"].rows
            task_name = opts["task_options"].get("check_with")
            self.task = get_task(task_name) if task_name else None

    def next(self) -> Problem:
        """The next prompt; a file's row keeps its other columns in ``meta``."""
        self.cursor += 1
        if self.rows:
            row = self.rows[self._row_index(self.cursor - 1)]
            extra = {k: v for k, v in row.items() if k not in ("prompt", "answer")}
            return Problem(prompt=row["prompt"], answer=row["answer"], meta=extra)
        assert self.task is not None
        return self.task.sample(self.rng)

    def _row_index(self, i: int) -> int:
        epoch, at = divmod(i, len(self.rows))
        if not self.shuffle:
            return at
        if self._order[0] != epoch:
            order = list(range(len(self.rows)))
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
            self._order = (epoch, order)
        return self._order[1][at]

    def check(self, answer: str | None, completion: str) -> bool | None:
        """The task's exact rule, or None when the prompts have no rule (or no answer)."""
        if self.task is None or answer is None:
            return None
        return self.task.check(answer, completion)
