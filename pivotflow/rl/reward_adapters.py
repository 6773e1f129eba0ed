"""Reward functions written for verl or TRL, as pivotflow stage functions (``Graph.map``).

A pivotflow stage function takes sample fields by name, one sample at a time: the decoded
response is ``completion``, the prompt file's answer is ``answer``, and every other column of
the file is a field of its own (``data_source``, ``extra_info``, ...). The two libraries call
their reward functions otherwise, and these wrap one unchanged:

* ``verl_reward(compute_score)``: verl's ``custom_reward_function``, called as
  ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`` and returning a
  number, or a dict whose ``"score"`` is the reward (verl logs its other keys; name the ones
  to keep with ``extra=("acc",)``, and add them to the stage's ``writes``);
* ``trl_reward(reward_func)``: a TRL ``reward_funcs`` entry, called on a batch as
  ``reward_func(prompts=[...], completions=[...], **columns)`` (each dataset column a list)
  and returning a list of floats (None: "does not apply", which TRL skips; here 0.0 with a
  count, since a sample needs a reward). Here the batch is the one sample; the columns are the
  sample's fields but the per-token ones, and ``completion_ids`` its response's token ids.

    g.map("reward", verl_reward(compute_score), writes=["reward"])

``data_source`` and ``extra_info`` are read when the prompt file has them (verl's own files
do) and passed as None otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

# per-token fields the runtime writes, which TRL never passes a reward function
_TOKEN_LEVEL = frozenset({"prompt_ids", "response_ids", "logprobs", "versions", "ref_logprobs",
                          "values", "loss_mask"})


def verl_reward(compute_score: Callable[..., Any],
                extra: Sequence[str] = ()) -> Callable[..., Any]:
    """``compute_score`` (verl's signature) as a ``Graph.map`` function writing ``reward`` (and
    the ``extra`` keys of a dict it returns)."""
    name = getattr(compute_score, "__name__", "compute_score")

    def reward(completion: str, answer: str | None, data_source: str | None = None,
               extra_info: Any = None, **_: Any) -> Any:
        out = compute_score(data_source=data_source, solution_str=completion,
                            ground_truth=answer, extra_info=extra_info)
        if isinstance(out, dict):
            if "score" not in out:
                raise ValueError(f"verl reward {name} returned a dict without 'score' (keys "
                                 f"{sorted(out)[:8]})")
            missing = [k for k in extra if k not in out]
            if missing:
                raise ValueError(f"verl reward {name} returned no {missing[0]!r}, which "
                                 f"extra= names (keys {sorted(out)[:8]})")
            return {"reward": _number(out["score"], name), **{k: out[k] for k in extra}}
        value = _number(out, name)
        return {"reward": value, **dict.fromkeys(extra)} if extra else value

    reward.__name__ = f"verl_{name}"
    reward.__qualname__ = reward.__name__
    return reward


def trl_reward(reward_func: Callable[..., Any]) -> Callable[..., Any]:
    """``reward_func`` (TRL's batch signature) as a ``Graph.map`` function writing ``reward``
    for one sample. A None reward counts in ``reward_func.not_applicable`` and reads 0.0."""
    name = getattr(reward_func, "__name__", "reward_func")

    def reward(prompt: Any, completion: str, **fields: Any) -> float:
        # the dataset's columns and the run's per-sample values, as TRL passes its columns;
        # the token-level ones left out but the response's ids (TRL's completion_ids)
        columns = {k: [v] for k, v in fields.items() if k not in _TOKEN_LEVEL}
        columns["completion_ids"] = [fields.get("response_ids", [])]
        out = reward_func(prompts=[prompt], completions=[completion], **columns)
        if not isinstance(out, list | tuple) or len(out) != 1:
            raise ValueError(f"TRL reward {name} returned {type(out).__name__} "
                             f"{_short(out)}: a list of one reward per completion (1 here)")
        if out[0] is None:
            reward.not_applicable += 1  # type: ignore[attr-defined]
            return 0.0
        return _number(out[0], name)

    reward.not_applicable = 0  # type: ignore[attr-defined]
    reward.__name__ = f"trl_{name}"
    reward.__qualname__ = reward.__name__
    return reward


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
