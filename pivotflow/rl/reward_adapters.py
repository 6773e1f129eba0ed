"""Reward functions written for verl or TRL, as pivotflow stage functions (``Graph.map``,
``Graph.group``).

A pivotflow stage function takes sample fields by name, one sample at a time: the decoded
response is ``completion``, the prompt file's answer is ``answer``, and every other column of
the file is a field of its own (``data_source``, ``extra_info``, ...). The two libraries call
their reward functions otherwise, and these wrap one unchanged:

* ``verl_reward(compute_score)``: verl's ``custom_reward_function``, called as
  ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`` and returning a
  number, or a dict whose ``"score"`` is the reward (verl logs its other keys; name the ones
  to keep with ``extra=("acc",)``, and add them to the stage's ``writes``); with
  ``batch=True``, verl's batch reward manager's ``compute_score(data_sources=,
  solution_strs=, ground_truths=, extra_infos=)`` on a prompt's group (``g.group``);
* ``trl_reward(reward_funcs, weights)``: TRL's ``reward_funcs`` and ``reward_weights``, each
  function called on a batch as ``f(prompts=[...], completions=[...], completion_ids=[...],
  trainer_state=..., log_metric=..., log_extra=..., **columns)`` (each dataset column a
  list; a chat prompt's completion is one assistant message, as TRL gives it) and returning a list of
  floats or None ("does not apply"), summed with the weights as TRL sums them. The batch is
  one sample (``g.map``) or a prompt's group (``group=True``, ``g.group``); the columns are
  the samples' fields but the per-token ones; ``log_extra``'s columns (``extra=``) are
  fields too.

    g.map("reward", verl_reward(compute_score), writes=["reward"])

``data_source`` and ``extra_info`` are read when the prompt file has them (verl's own files
do) and passed as None otherwise. Where a wrapped function is ``async def`` (an LLM judge over
HTTP), the stage function returns a coroutine, which the controller awaits on its loop while
the run goes on (``Graph.map``'s ``concurrency`` calls at once).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pivotflow.controller.user_metrics import log_metric, run_steps

# per-token fields the runtime writes, which TRL never passes a reward function
_TOKEN_LEVEL = frozenset({"prompt_ids", "response_ids", "logprobs", "versions", "ref_logprobs",
                          "values", "loss_mask"})
RewardFunc = Callable[..., Any]


def verl_reward(compute_score: Callable[..., Any], extra: Sequence[str] = (), *,
                batch: bool = False) -> Callable[..., Any]:
    """``compute_score`` (verl's signature) as a ``Graph.map`` function writing ``reward`` (and
    the ``extra`` keys of a dict it returns). ``batch=True``: verl's batch reward manager's
    signature instead, ``compute_score(data_sources=, solution_strs=, ground_truths=,
    extra_infos=)`` returning one number or dict per response, as a ``Graph.group`` function
    called once on a prompt's whole group. An ``async def`` one (verl's reward loop takes
    those) is awaited."""
    name = getattr(compute_score, "__name__", "compute_score")

    def reward(completion: str, answer: str | None, data_source: str | None = None,
               extra_info: Any = None, **_: Any) -> Any:
        def scored(outs: list[Any]) -> Any:
            score, kept = _verl_score(outs[0], name, extra)
            return {"reward": score, **kept} if extra else score

        return then([compute_score(data_source=data_source, solution_str=completion,
                                    ground_truth=answer, extra_info=extra_info)], scored)

    def batch_reward(completion: list[str], answer: list[Any],
                     data_source: list[Any] | None = None, extra_info: list[Any] | None = None,
                     **_: Any) -> Any:
        n = len(completion)

        def scored(returned: list[Any]) -> dict[str, list[Any]]:
            outs = returned[0]
            if not isinstance(outs, list | tuple) or len(outs) != n:
                raise ValueError(f"verl batch reward {name} returned {type(outs).__name__} "
                                 f"{_short(outs)}: a list of one score per response ({n} here)")
            each = [_verl_score(out, name, extra) for out in outs]
            return {"reward": [score for score, _ in each],
                    **{k: [kept[k] for _, kept in each] for k in extra}}

        return then([compute_score(data_sources=data_source or [None] * n,
                                    solution_strs=completion, ground_truths=answer,
                                    extra_infos=extra_info or [None] * n)], scored)

    fn = batch_reward if batch else reward
    fn.__name__ = f"verl_{name}"
    fn.__qualname__ = fn.__name__
    return fn


def _verl_score(out: Any, name: str, extra: Sequence[str]) -> tuple[float, dict[str, Any]]:
    """One response's reward and ``extra`` keys from what verl's ``compute_score`` returned
    for it: a number, or a dict whose ``"score"`` is the reward."""
    if not isinstance(out, dict):
        return _number(out, name), dict.fromkeys(extra)
    if "score" not in out:
        raise ValueError(f"verl reward {name} returned a dict without 'score' (keys "
                         f"{sorted(out)[:8]})")
    missing = [k for k in extra if k not in out]
    if missing:
        raise ValueError(f"verl reward {name} returned no {missing[0]!r}, which "
                         f"extra= names (keys {sorted(out)[:8]})")
    return _number(out["score"], name), {k: out[k] for k in extra}


def trl_reward(reward_funcs: RewardFunc | Sequence[RewardFunc],
               weights: Sequence[float] | None = None, *, group: bool = False,
               each: bool = False, extra: Sequence[str] = ()) -> Callable[..., Any]:
    """TRL's ``reward_funcs`` (one function or a list) and ``reward_weights`` as a stage
    function writing ``reward``, summed as TRL's GRPO sums them: ``sum(w_i * r_i)`` over the
    functions that apply (a None leaves its term out, TRL's ``nansum``), and None when none
    applies (TRL's "unscorable": out of its group's baseline, advantage 0, which is what a
    failed reward is here).

    ``group=False``: a ``Graph.map`` function, each function called on a batch of one sample.
    ``group=True``: a ``Graph.group`` function, each called once on a prompt's whole group
    (TRL calls them on a batch; this is the batch a group-relative advantage reads, and what
    a reward that runs a model or compares completions wants). ``each=True`` also writes each
    function's reward as ``reward_<its name>`` (None where it does not apply): add those to
    the stage's ``writes``, and the step's ``field_means`` in metrics.jsonl logs their means,
    as TRL logs ``rewards/<name>/mean``.

    ``extra=("parsed_answer", ...)``: the columns the functions may log with TRL's
    ``log_extra(column, values)`` (one value per completion of the call), written as fields of
    those names (add them to the stage's ``writes``; a column not logged in a call is None):
    each sample's line in samples.jsonl shows them under ``stage_fields``, as TRL's
    completions table shows its extra columns, and ``field_means`` averages the numeric ones.
    A column logged twice in one call keeps the later values (TRL appends both, out of
    step with its completions)."""
    funcs: list[RewardFunc] = (list(reward_funcs) if isinstance(reward_funcs, list | tuple)
                               else [reward_funcs])  # type: ignore[list-item]
    names = _func_names(funcs)
    scale = _weights(weights, len(funcs))
    fields_out = [f"reward_{n}" for n in names]
    columns_out = _extra_columns(extra, ["reward", *fields_out])

    def rewards_of(fields: dict[str, list[Any]], n: int,
                   finish: Callable[[list[list[float | None]], dict[str, list[Any]]], Any]
                   ) -> Any:
        prompts, completions = _conversation(fields.pop("prompt"), fields.pop("completion"))
        # the dataset's columns and the run's per-sample values, as TRL passes its columns;
        # the token-level ones left out but the response's ids (TRL's completion_ids)
        ids = fields.get("response_ids") or [[] for _ in range(n)]
        columns: dict[str, Any] = {k: v for k, v in fields.items()
                                   if k not in _TOKEN_LEVEL}
        columns["completion_ids"] = ids
        columns["trainer_state"] = TrainerStep(_steps_done(fields.get("versions")),
                                               run_steps())
        columns["log_metric"] = log_metric  # TRL's: into the step record's logged_metrics
        logged = {c: [None] * n for c in columns_out}  # log_extra's columns for this call
        columns["log_extra"] = _extra_logger(logged, n)
        return then([f(prompts=prompts, completions=completions, **columns) for f in funcs],
                     lambda outs: finish([_checked(out, name, n)
                                          for out, name in zip(outs, names, strict=True)],
                                         logged))

    def total(per_func: list[float | None]) -> float | None:
        terms = [w * r for w, r in zip(scale, per_func, strict=True) if r is not None]
        return sum(terms) if terms else None

    def sample_reward(prompt: Any, completion: str, **fields: Any) -> Any:
        def finish(per_func: list[list[float | None]], logged: dict[str, list[Any]]) -> Any:
            per = [r[0] for r in per_func]
            if not (each or logged):
                return total(per)
            return {"reward": total(per), **(dict(zip(fields_out, per, strict=True)) if each
                                             else {}), **{c: v[0] for c, v in logged.items()}}

        return rewards_of({"prompt": [prompt], "completion": [completion],
                           **{k: [v] for k, v in fields.items()}}, 1, finish)

    def group_reward(prompt: list[Any], completion: list[str], **fields: Any) -> Any:
        n = len(completion)

        def finish(per: list[list[float | None]],
                   logged: dict[str, list[Any]]) -> dict[str, list[Any]]:
            out = {"reward": [total([r[i] for r in per]) for i in range(n)], **logged}
            return {**out, **dict(zip(fields_out, per, strict=True))} if each else out

        return rewards_of({"prompt": list(prompt), "completion": list(completion), **fields},
                          n, finish)

    fn = group_reward if group else sample_reward
    fn.__name__ = f"trl_{'_'.join(names)}"
    fn.__qualname__ = fn.__name__
    return fn


@dataclass(frozen=True, slots=True)
class TrainerStep:
    """What a TRL reward function reads of ``trainer_state`` (transformers' ``TrainerState``)
    for reward shaping over a run: ``global_step``, the optimizer steps done when the response
    was sampled (its first token's policy version; with max_staleness > 0 a step or more
    behind the trainer, as the response is), and ``max_steps``, the run's ``steps`` (a
    curriculum's ``global_step / max_steps``). Other ``TrainerState`` attributes are not
    known to a stage: reading one is an AttributeError the stage reports."""

    global_step: int
    max_steps: int = 0


def _func_names(funcs: list[Any]) -> list[str]:
    if not funcs:
        raise ValueError("trl_reward: no reward function given")
    names: list[str] = []
    for i, f in enumerate(funcs):
        if isinstance(f, str) or not callable(f) or hasattr(f, "forward"):
            raise ValueError(f"trl_reward: reward function {i} is {type(f).__name__} "
                             f"{_short(f)}; a reward model runs as g.reward_model(...), not "
                             "inside a stage")
        name = re.sub(r"\W+", "_", getattr(f, "__name__", "")).strip("_") or f"func{i}"
        while name in names:  # two of one name (two lambdas) stay two fields
            name = f"{name}_{i}"
        names.append(name)
    return names


def _extra_columns(extra: Sequence[str], taken: list[str]) -> list[str]:
    """``trl_reward``'s ``extra=``: field names, none of them the rewards' own."""
    if isinstance(extra, str):
        raise ValueError(f"trl_reward: extra={extra!r} is one string; give a sequence of "
                         f"column names, extra=({extra!r},)")
    out = list(extra)
    for c in out:
        if not isinstance(c, str) or not c.isidentifier() or c.startswith("_"):
            raise ValueError(f"trl_reward: extra column {_short(c)} is not a field name (an "
                             "identifier not starting with '_')")
        if c in taken or out.count(c) > 1:
            raise ValueError(f"trl_reward: extra column {c!r} is named twice (or is a "
                             "reward's own field)")
    return out


def _extra_logger(logged: dict[str, list[Any]], n: int) -> Callable[[str, list[Any]], None]:
    """TRL's ``log_extra(column, values)`` for one call: ``values[i]`` is completion ``i``'s."""

    def log_extra(column: str, values: list[Any]) -> None:
        if column not in logged:
            raise ValueError(f"log_extra({_short(column)}): not a column this stage keeps; "
                             f"name it in trl_reward(..., extra=({column!r},)) and in the "
                             "stage's writes")
        if isinstance(values, str) or not isinstance(values, Sequence) or len(values) != n:
            raise ValueError(f"log_extra({column!r}): {type(values).__name__} "
                             f"{_short(values)}; a list of one value per completion ({n} "
                             "here)")
        logged[column] = list(values)

    return log_extra


def _weights(weights: Sequence[float] | None, n: int) -> list[float]:
    if weights is None:
        return [1.0] * n
    out = list(weights)
    if len(out) != n:
        raise ValueError(f"trl_reward: {len(out)} weights for {n} reward functions")
    for w in out:
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w):
            raise ValueError(f"trl_reward: weight {_short(w)} is not a finite number")
    return [float(w) for w in out]


def _conversation(prompts: list[Any], completions: list[str]) -> tuple[list[Any], list[Any]]:
    """TRL's prompts and completions: a chat prompt's completion is one assistant message,
    and a prompt ending in an assistant message (a prefill) gives that message's text to the
    completion, which continues it."""
    out_prompts: list[Any] = []
    out_completions: list[Any] = []
    for prompt, text in zip(prompts, completions, strict=True):
        if not _is_chat(prompt):
            out_prompts.append(prompt)
            out_completions.append(text)
            continue
        prefill = prompt[-1]["content"] if prompt and prompt[-1].get("role") == "assistant" \
            else None
        out_prompts.append(prompt[:-1] if prefill is not None else list(prompt))
        out_completions.append([{"role": "assistant", "content": (prefill or "") + text}])
    return out_prompts, out_completions


def _is_chat(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)


def _steps_done(versions: list[Any] | None) -> int:
    firsts = [v[0] for v in (versions or []) if v]
    return min(firsts) if firsts else 0


def then(outs: list[Any], finish: Callable[[list[Any]], Any]) -> Any:
    """``finish(outs)``, or, when some of ``outs`` are awaitables (async reward functions: an
    LLM judge over HTTP), a coroutine that awaits them together, as TRL gathers them, and
    then finishes. The controller awaits that coroutine on its loop beside the run (an async
    stage function's call: controller/async_calls.py), under the stage's deadline; if one
    fails, the others are cancelled and its error is the stage's."""
    pending = [i for i, out in enumerate(outs) if inspect.isawaitable(out)]
    if not pending:
        return finish(outs)

    async def gathered() -> Any:
        if len(pending) == 1:  # (no task of its own: one less on the loop per call)
            done = list(outs)
            done[pending[0]] = await outs[pending[0]]
            return finish(done)
        try:
            async with asyncio.TaskGroup() as calls:
                tasks = [calls.create_task(_coroutine(outs[i])) for i in pending]
        except BaseExceptionGroup as failed:  # the first failure, named as it was raised
            raise failed.exceptions[0] from None
        done = list(outs)
        for i, task in zip(pending, tasks, strict=True):
            done[i] = task.result()
        return finish(done)

    return gathered()


async def _coroutine(pending: Awaitable[Any]) -> Any:
    return await pending


def _checked(out: Any, name: str, n: int) -> list[float | None]:
    if not isinstance(out, list | tuple) or len(out) != n:
        raise ValueError(f"TRL reward {name} returned {type(out).__name__} {_short(out)}: a "
                         f"list of one reward per completion ({n} here)")
    return [None if r is None else _number(r, name) for r in out]


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"reward {name} returned {type(value).__name__} {_short(value)}, "
                         "not a number")
    return float(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
