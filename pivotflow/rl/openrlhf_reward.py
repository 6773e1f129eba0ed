"""OpenRLHF's reward functions and remote reward servers as a pivotflow stage function.

OpenRLHF takes ``--remote_rm_url`` as either a Python file defining ``reward_func(queries,
prompts, labels, **kwargs)`` or the URL of a reward server (``openrlhf.cli.serve_rm``, or any
server speaking its protocol: ``POST {"query": [...], "prompts": [...], "labels": [...]}``,
answered with ``{"rewards": [...], "scores": [...], "extra_logs": {...}}``). Both read the text
the policy read: ``queries`` are the whole sequences decoded with special tokens (the prompt as
its chat template rendered it, then the response), ``prompts`` the rendered prompts, ``labels``
the dataset's label column. Here those are the runtime's ``sequence_text`` and ``prompt_text``
fields (decoded only for a graph that names them) and a field of the prompt file (``answer`` by
default: the ``--label_key``).

    g.map("reward", openrlhf_reward("http://127.0.0.1:5000/get_reward"), writes=["reward"],
          deadline_s=600)

What comes back: ``rewards`` is the reward; ``scores`` (OpenRLHF's values for dynamic
filtering, the rewards where absent) is written as ``score`` with ``scores=True``, for a
``g.filter`` to read; each ``extra_logs`` entry is logged with ``log_metric`` (one value per
response, or one for the call), so its mean per step is in metrics.jsonl's ``logged_metrics``,
as OpenRLHF logs it to W&B. A function may return a tensor, a list, or such a dict.

A server is called without holding the run: the stage function returns a coroutine, which the
controller awaits on its loop (``concurrency`` requests at once, ``Graph.map``'s). Several URLs
take the calls in turn, and a request that fails is tried again on the next one, as OpenRLHF
retries (5 tries; ``http_calls``: 1 s, then doubling, or a ``Retry-After``): a 4xx answer is
not, but 408 and 429 are. The stage's ``deadline_s`` bounds
the whole (the default 60 s is short for a model-based server: raise it).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pivotflow.controller.user_metrics import log_metric
from pivotflow.rl.http_calls import Endpoints, short
from pivotflow.rl.reward_adapters import then


def openrlhf_reward(reward_func: str | Sequence[str] | Callable[..., Any], *,
                    label: str | None = "answer", group: bool = False, scores: bool = False,
                    retries: int = 5, timeout_s: float = 180.0) -> Callable[..., Any]:
    """``reward_func`` (a callable or a ``.py`` file defining ``reward_func``, sync or
    ``async def``; or a reward server's URL, or several) as a stage function writing
    ``reward`` (and ``score`` with ``scores=True``): a ``Graph.map`` function calling it on
    one sample, or with ``group=True`` a ``Graph.group`` function calling it once on a
    prompt's group. ``label`` names the field passed as ``labels`` (None: no labels)."""
    call, name = _caller(reward_func, retries, timeout_s)
    outputs = ("reward", "score") if scores else ("reward",)

    def labels_of(fields: dict[str, Any], n: int) -> list[Any]:
        if label is None:
            return [None] * n
        if label not in fields:
            raise ValueError(f"OpenRLHF reward {name}: no field {label!r} to pass as labels "
                             f"(label={label!r}; the sample has {sorted(fields)[:10]})")
        return fields[label]

    def sample_reward(prompt_text: str, sequence_text: str, **fields: Any) -> Any:
        labels = labels_of({k: [v] for k, v in fields.items()}, 1)

        def finish(outs: list[Any]) -> Any:
            read = _read(outs[0], name, 1)
            return {k: v[0] for k, v in zip(outputs, read, strict=False)} if scores \
                else read[0][0]

        return then([call([sequence_text], [prompt_text], labels)], finish)

    def group_reward(prompt_text: list[str], sequence_text: list[str], **fields: Any) -> Any:
        n = len(sequence_text)
        labels = labels_of(fields, n)

        def finish(outs: list[Any]) -> dict[str, list[float]]:
            return dict(zip(outputs, _read(outs[0], name, n), strict=False))

        return then([call(list(sequence_text), list(prompt_text), labels)], finish)

    fn = group_reward if group else sample_reward
    fn.__name__ = f"openrlhf_{name}"
    fn.__qualname__ = fn.__name__
    return fn


def _caller(reward_func: Any, retries: int, timeout_s: float
            ) -> tuple[Callable[[list[str], list[str], list[Any]], Any], str]:
    """``(call(queries, prompts, labels), name)`` for what ``--remote_rm_url`` may name."""
    if callable(reward_func):
        name = getattr(reward_func, "__name__", "reward_func")
        return (lambda q, p, labels: reward_func(q, p, labels)), name
    urls = [reward_func] if isinstance(reward_func, str) else list(reward_func)
    if not urls or not all(isinstance(u, str) for u in urls):
        raise ValueError(f"OpenRLHF reward: {short(reward_func)} is neither a function, a .py "
                         "file nor a reward server's URL")
    if len(urls) == 1 and urls[0].endswith(".py"):
        func = _from_file(Path(urls[0]))
        return (lambda q, p, labels: func(q, p, labels)), Path(urls[0]).stem
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"OpenRLHF reward: {short(url)} is neither a .py file nor an "
                             "http(s):// URL")
    server = Endpoints(urls, retries=retries, timeout_s=timeout_s, what="reward server")
    return (lambda q, p, labels: server.post({"query": q, "prompts": p, "labels": labels})), \
        "server"


def _from_file(path: Path) -> Callable[..., Any]:
    """The ``reward_func`` a Python file defines (OpenRLHF loads it the same way)."""
    if not path.is_file():
        raise ValueError(f"OpenRLHF reward: {path}: no such file")
    spec = importlib.util.spec_from_file_location(f"openrlhf_reward_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ValueError(f"OpenRLHF reward: {path} raised {type(exc).__name__} on import: "
                         f"{short(exc, 200)}") from None
    func = getattr(module, "reward_func", None)
    if not callable(func):
        raise ValueError(f"OpenRLHF reward: {path} defines no reward_func(queries, prompts, "
                         "labels)")
    return func  # type: ignore[no-any-return]


def _read(out: Any, name: str, n: int) -> tuple[list[float], list[float]]:
    """(rewards, scores) of ``n`` responses from what a function or server returned; its
    ``extra_logs`` are logged with ``log_metric``."""
    if not isinstance(out, dict):
        rewards = _numbers(out, name, "rewards", n)
        return rewards, rewards
    if "rewards" not in out:
        raise ValueError(f"OpenRLHF reward {name} returned a dict without 'rewards' (keys "
                         f"{sorted(out)[:8]})")
    rewards = _numbers(out["rewards"], name, "rewards", n)
    got = out.get("scores")
    scores = rewards if got is None else _numbers(got, name, "scores", n)
    logs = out.get("extra_logs") or {}
    if not isinstance(logs, dict):
        raise ValueError(f"OpenRLHF reward {name} returned extra_logs of type "
                         f"{type(logs).__name__}, expected a dict")
    for key, value in logs.items():
        values = _plain(value)
        for v in values if isinstance(values, list) else [values]:
            log_metric(str(key), _number(v, name, f"extra_logs[{key!r}]"))
    return rewards, scores


def _numbers(value: Any, name: str, what: str, n: int) -> list[float]:
    values = _plain(value)
    if isinstance(values, int | float) and n == 1:  # (a 0-d tensor for one query)
        values = [values]
    if not isinstance(values, list) or len(values) != n:
        raise ValueError(f"OpenRLHF reward {name} returned {what} {short(value)}: one number "
                         f"per query ({n} here)")
    return [_number(v, name, what) for v in values]


def _plain(value: Any) -> Any:
    """A tensor or array as lists and numbers (OpenRLHF's functions return tensors)."""
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else list(value) if isinstance(value, tuple) else value


def _number(value: Any, name: str, what: str) -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"OpenRLHF reward {name} returned {what} holding {short(repr(value))}, "
                         "not a finite number")
    return float(value)
