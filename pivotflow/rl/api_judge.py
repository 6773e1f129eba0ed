"""A generative judge behind an OpenAI-compatible API (vLLM's or SGLang's server, a hosted
model) as a stage function: the GenRM of ``Graph.judge``, served outside the run's pools.

    g.map("genrm", openai_judge("http://127.0.0.1:8000/v1", "judge", judge_template, parse),
          writes=["verdict", "reward", "judge_failed"], deadline_s=300)

``template(**fields)`` and ``parse(verdict, **fields)`` are a ``Graph.judge``'s, with the same
contract (``pivotflow.verdicts``): a string template is sent as it is to ``/completions``
(the server encodes it with the model's special tokens), chat messages to
``/chat/completions`` (the server renders them with the model's chat template); the answer's
text is the ``verdict``, ``parse`` turns it into the ``reward``, and a verdict it cannot read
(None) is a failed judgement: ``reward`` None and ``judge_failed`` True (the run then gives
that sample advantage 0, as for a pool's judge; its per-step share is ``field_means``'
``judge_failed`` in metrics.jsonl). Greedy by default (``temperature=0``), as a pool's judge.

The request is awaited on the controller's loop (the stage's ``concurrency`` at once), so
rollouts and training go on while the judge works; several base URLs take requests in turn,
and a failed one is tried again (``http_calls``: 5 tries, waiting a ``Retry-After`` or 1, 2, 4,
8 s; a 400 is not tried again, a 429 is). The key, if the server wants one, is read from the environment variable ``api_key_env``
when the graph is built, and sent as ``Authorization: Bearer``.

What a pool's judge has that this does not: the planner's elasticity (the judge's workers
shift to rollout or training when the judge is idle) and its ``judge_failures`` ledger count.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

from pivotflow.graph import fn_reads
from pivotflow.messages import message_problem
from pivotflow.rl.http_calls import Endpoints, short


def openai_judge(base_url: str | Sequence[str], model: str, template: Callable[..., Any],
                 parse: Callable[..., float | None], *, max_tokens: int = 8,
                 temperature: float = 0.0, top_p: float = 1.0,
                 api_key_env: str | None = "OPENAI_API_KEY", retries: int = 5,
                 timeout_s: float = 180.0,
                 extra_body: dict[str, Any] | None = None) -> Callable[..., Any]:
    """A ``Graph.map`` function writing ``verdict``, ``reward`` and ``judge_failed`` from the
    judge ``model`` at ``base_url`` (``.../v1``; or several, in turn). ``extra_body`` is
    merged into every request (a server's own sampling options)."""
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    key = os.environ.get(api_key_env) if api_key_env else None
    server = Endpoints([u.rstrip("/") for u in urls], retries=retries, timeout_s=timeout_s,
                       headers={"Authorization": f"Bearer {key}"} if key else None,
                       what=f"judge {model!r}")
    reads = (fn_reads(template, "openai_judge", "template")
             | (fn_reads(parse, "openai_judge", "parse") - {"verdict"}))
    sampling = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
                **(extra_body or {})}

    async def judge(**fields: Any) -> dict[str, Any]:
        prompt = template(**fields)
        if isinstance(prompt, str):
            answer = await server.post({"model": model, "prompt": prompt, **sampling},
                                       "/completions")
            verdict = _text(answer, "text", model)
        else:
            problem = message_problem(prompt)
            if problem is not None:
                raise ValueError(f"template returned {type(prompt).__name__}, expected a str "
                                 f"or a list of chat messages ({problem})")
            answer = await server.post({"model": model, "messages": prompt, **sampling},
                                       "/chat/completions")
            verdict = _text(answer, "message", model)
        reward = parse(verdict=verdict, **{k: v for k, v in fields.items() if k != "verdict"})
        if isinstance(reward, str):  # a number as text is a bug to name, not a verdict
            raise ValueError(f"parse returned a str {short(reward)}, expected a number or None")
        score = (None if isinstance(reward, bool) or not isinstance(reward, int | float)
                 else float(reward))
        return {"verdict": verdict, "reward": score, "judge_failed": score is None}

    # the stage reads what the template and parse read: the graph checks them along its edges
    judge.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in sorted(reads)]
        + [inspect.Parameter("fields", inspect.Parameter.VAR_KEYWORD)])
    judge.__name__ = judge.__qualname__ = f"openai_judge_{model}"
    return judge


def _text(answer: Any, kind: str, model: str) -> str:
    """The first choice's text (``/completions``) or message content (``/chat/...``)."""
    try:
        choice = answer["choices"][0]
        text = choice["text"] if kind == "text" else choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"judge {model!r} answered without choices[0]."
                         f"{'text' if kind == 'text' else 'message.content'}: "
                         f"{short(answer, 120)}") from None
    if not isinstance(text, str):
        raise ValueError(f"judge {model!r} answered a {type(text).__name__} as its text")
    return text
