"""slime's reward functions (``--custom-rm-path``) and remote reward (``--rm-type remote_rm``)
as a pivotflow stage function.

slime calls ``await custom_rm(args, sample)`` on each response (with ``--group-rm``,
``await custom_rm(args, samples)`` on a prompt's group, returning one reward each), where
``sample`` is slime's ``Sample``: ``prompt`` (text or messages), ``tokens`` (the prompt's ids and
then the response's), ``response``, ``response_length``, ``label``, ``metadata``, ``index``,
``group_index``, ``status``, ``loss_mask``, ``rollout_log_probs``. A reward is a number, or a
dict from which ``--reward-key`` picks it. Its remote reward POSTs ``{"prompt", "response",
"label"}`` to ``--rm-url`` and takes the JSON answer as the reward.

    g.map("reward", slime_reward("my_rm.reward_func", args={"rm_type": "math"}),
          writes=["reward"])

Here ``sample`` is a :class:`SlimeSample` made from the sample's fields (``label`` names the
field slime's ``--label-key`` read: ``answer`` by default; ``metadata`` the fields that become
its ``metadata`` dict, slime's ``--metadata-key`` column), and ``args`` a namespace of what
``args=`` holds (the ``args.*`` the function reads; reading another is an AttributeError the
stage reports). An ``async def`` one, or the remote call, is awaited on the controller's loop.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from pivotflow.rl.http_calls import Endpoints, short
from pivotflow.rl.reward_adapters import then

REMOTE_RETRIES = 10  # slime's remote_rm's tries


@dataclass(slots=True)
class SlimeSample:
    """The attributes of slime's ``Sample`` a reward function reads."""

    index: int
    group_index: int
    prompt: Any
    tokens: list[int]
    response: str
    response_length: int
    label: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    status: str = "completed"  # or "truncated" (the response ran to its max_tokens)
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    reward: Any = None


def slime_reward(custom_rm: str | Callable[..., Any], *, label: str = "answer",
                 metadata: Sequence[str] = (), group: bool = False,
                 reward_key: str | None = None, args: dict[str, Any] | None = None,
                 timeout_s: float = 120.0) -> Callable[..., Any]:
    """``custom_rm`` (a callable, or slime's dotted ``--custom-rm-path`` such as
    ``"my_rm.reward_func"``; or an ``http(s)://`` URL, slime's ``--rm-url``) as a stage function
    writing ``reward``: a ``Graph.map`` one, or with ``group=True`` (slime's ``--group-rm``) a
    ``Graph.group`` one. ``reward_key`` picks the reward out of a dict (``--reward-key``)."""
    namespace = SimpleNamespace(**(args or {}))
    call, name = _caller(custom_rm, timeout_s)

    def reward_of(out: Any) -> float | None:
        if isinstance(out, dict):
            if reward_key is None:
                raise ValueError(f"slime reward {name} returned a dict (keys {sorted(out)[:8]}): "
                                 "name the reward's key with reward_key= (slime's --reward-key)")
            if reward_key not in out:
                raise ValueError(f"slime reward {name} returned no {reward_key!r} (keys "
                                 f"{sorted(out)[:8]})")
            out = out[reward_key]
        if out is None:
            return None
        if isinstance(out, int | float):  # (a bool too: 1.0 or 0.0)
            return float(out)
        raise ValueError(f"slime reward {name} returned {type(out).__name__} "
                         f"{short(repr(out))}, not a number")

    def sample_reward(**fields: Any) -> Any:
        return then([call(namespace, _sample(fields, label, metadata))],
                    lambda outs: reward_of(outs[0]))

    def group_reward(**fields: Any) -> Any:
        n = len(fields["response"])
        samples = [_sample({k: v[i] for k, v in fields.items()}, label, metadata)
                   for i in range(n)]

        def finish(outs: list[Any]) -> dict[str, list[float | None]]:
            got = outs[0]
            if not isinstance(got, list | tuple) or len(got) != n:
                raise ValueError(f"slime group reward {name} returned {type(got).__name__} "
                                 f"{short(repr(got))}: a list of one reward per sample "
                                 f"({n} here)")
            return {"reward": [reward_of(r) for r in got]}

        return then([call(namespace, samples)], finish)

    fn = group_reward if group else sample_reward
    fn.__name__ = fn.__qualname__ = f"slime_{name}"
    return fn


def _caller(custom_rm: Any, timeout_s: float) -> tuple[Callable[[Any, Any], Any], str]:
    if callable(custom_rm):
        return custom_rm, getattr(custom_rm, "__name__", "custom_rm")
    if not isinstance(custom_rm, str) or not custom_rm:
        raise ValueError(f"slime reward: {short(repr(custom_rm))} is neither a function, a "
                         "module.function path nor a URL")
    if custom_rm.startswith(("http://", "https://")):
        server = Endpoints([custom_rm], retries=REMOTE_RETRIES, timeout_s=timeout_s,
                           what="slime reward server")

        def remote(args: Any, sample: Any) -> Any:
            if isinstance(sample, list):
                raise ValueError("slime's remote_rm scores one sample a call: group=False")
            return server.post({"prompt": sample.prompt, "response": sample.response,
                                "label": sample.label})

        return remote, "remote_rm"
    module, _, attr = custom_rm.rpartition(".")
    try:
        func = getattr(importlib.import_module(module), attr, None) if module else None
    except Exception as exc:
        raise ValueError(f"slime reward: importing {module!r} for {custom_rm!r} raised "
                         f"{type(exc).__name__}: {short(exc, 200)}") from None
    if not callable(func):
        raise ValueError(f"slime reward: {custom_rm!r} names no function (module.function, "
                         "as --custom-rm-path)")
    return func, attr


def _sample(fields: dict[str, Any], label: str, metadata: Sequence[str]) -> SlimeSample:
    """slime's view of one sample's fields."""
    if label not in fields:
        raise ValueError(f"slime reward: no field {label!r} to pass as the label (label=; the "
                         f"sample has {sorted(fields)[:10]})")
    missing = [k for k in metadata if k not in fields]
    if missing:
        raise ValueError(f"slime reward: no field {missing[0]!r} for metadata= (the sample has "
                         f"{sorted(fields)[:10]})")
    response_ids = list(fields.get("response_ids") or [])
    return SlimeSample(
        index=int(fields.get("sample_id", 0)), group_index=int(fields.get("group_id", 0)),
        prompt=fields.get("prompt"), tokens=list(fields.get("prompt_ids") or []) + response_ids,
        response=fields.get("response") or "", response_length=len(response_ids),
        label=fields[label], metadata={k: fields[k] for k in metadata},
        status="truncated" if fields.get("finish_reason") == "length" else "completed",
        loss_mask=fields.get("loss_mask"), rollout_log_probs=fields.get("logprobs"))
