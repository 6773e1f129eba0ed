"""Tool-calling trajectories of the built-in arithmetic task: written, encoded, sampled.

A trajectory follows ``pivotflow.tools.trajectory``: the prompt, a policy turn that calls the
``calculator`` in the Hermes/Qwen format, the tool's observation, and a second policy turn that
writes the answer. ``tool_segments`` writes the ideal one for the bootstrap, ``encode_segments``
turns examples into ids and a loss mask, ``self_samples`` draws a model's direct answers and
``rollout_eval`` samples whole trajectories with the embedded engine, running calls in-process.

Everything is in the model's own tokenizer and stays token-in/token-out: a sampled turn keeps
the ids the engine sampled (never decoded and encoded again), observations are encoded by the
tokenizer and appended, and whether a turn closed a call is read from its *decoded* text (the
built-in tokenizer has ``</tool_call>`` as one token, a user's may not).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pivotflow.engines.base import GenerationOutput, GenerationRequest, SamplingParams
from pivotflow.engines.torch.model import Decoder
from pivotflow.errors import ToolCallError, ToolError
from pivotflow.tasks.registry import Problem, get_task
from pivotflow.tasks.sft import pad_right, prompt_ids
from pivotflow.tokenizer.base import Tokenizer
from pivotflow.tools.builtin import calculator
from pivotflow.tools.parsers import HermesParser
from pivotflow.tools.pool import ToolResult
from pivotflow.tools.trajectory import answer_of, encode_observation, observation_text

# (text, or ids as sampled; trained): a policy turn is trained, an observation is not
Segment = tuple[str | list[int], bool]
TURN_TOKENS = 96  # most tokens of one policy turn (a call is 23 with the built-in tokenizer)
Example = tuple[str, list[Segment]]  # (prompt, segments after the prompt; EOS follows them)


def call_tool(text: str, parser: HermesParser) -> tuple[list[ToolResult], bool]:
    """Run the calls in a policy turn's ``text``: (results, well_formed).

    Never raises: a malformed call, an unknown tool, arguments that do not fit or a calculator
    error each become one result whose content is ``"Error: ..."`` (what the policy then reads),
    and ``well_formed`` is False.
    """
    calls = parser.parse(text)
    if isinstance(calls, ToolCallError):
        return [ToolResult(f"Error: {calls}", str(calls), "parse", "calculator")], False
    results: list[ToolResult] = []
    ok = bool(calls)
    for call in calls:
        try:
            if call.name != calculator.name:
                raise ToolError(f"unknown tool {call.name!r}; available tools: calculator")
            calculator.validate(call.arguments)
            results.append(ToolResult(str(calculator(**call.arguments)), name=call.name))
        except (ToolError, ValueError, ZeroDivisionError, TypeError) as exc:
            results.append(ToolResult(f"Error: {exc}", str(exc), "error", call.name))
            ok = False
    return results, ok


def tool_segments(problem: Problem, parser: HermesParser | None = None) -> list[Segment]:
    """The ideal tool trajectory after the prompt: the call (trained), the calculator's
    observation (not trained) and its answer copied (trained; EOS follows). Raises ValueError
    if the prompt is not an expression the calculator reads."""
    parser = parser or HermesParser()
    expression = problem.prompt.removesuffix("=")
    call = parser.format_call(calculator.name, {"expression": expression})
    content = str(calculator(expression=expression))
    observation = observation_text(parser, [ToolResult(content, name=calculator.name)])
    return [(call, True), (observation, False), (content, True)]


def segment_ids(tok: Tokenizer, segment: Segment) -> list[int]:
    """A segment's ids: kept as sampled, else a trained turn's text encoded, an observation's
    through ``encode_observation`` (as the controller encodes a tool's result)."""
    text, train = segment
    if not isinstance(text, str):
        return list(text)
    return tok.encode(text) if train else encode_observation(tok, text)


def encode_segments(
    tok: Tokenizer, examples: Sequence[Example]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [N, T] of ``prompt segment... EOS`` and a target mask [N, T-1] that is
    1 where ``ids[:, 1:]`` is a token of a trained segment or the final EOS (as
    ``sft.encode_pairs``); each segment is encoded on its own (``segment_ids``)."""
    seqs: list[list[int]] = []
    trained: list[list[bool]] = []
    for prompt, segments in examples:
        ids = prompt_ids(tok, prompt)
        flags = [False] * len(ids)
        for segment in segments:
            piece = segment_ids(tok, segment)
            ids += piece
            flags += [segment[1]] * len(piece)
        seqs.append(ids + [tok.eos_id])
        trained.append(flags + [True])
    ids_t = pad_right(seqs, tok.pad_id)
    mask = torch.zeros(ids_t.shape[0], max(ids_t.shape[1] - 1, 0), dtype=torch.bool)
    for row, flags in enumerate(trained):
        mask[row, : len(flags) - 1] = torch.tensor(flags[1:], dtype=torch.bool)
    return ids_t, mask


def self_samples(
    model: Decoder, tok: Tokenizer, problems: Sequence[Problem], seed: int
) -> list[Example]:
    """One temperature-1 direct answer of ``model`` per problem, as a training example with the
    sampled ids (samples cut off before EOS are dropped: the policy hardly makes them and they
    teach nothing; the EOS itself is not kept, ``encode_segments`` appends it)."""
    engine = engine_for(model, tok, 512, None)
    reqs = [
        GenerationRequest(
            str(i),
            prompt_ids(tok, p.prompt),
            SamplingParams(temperature=1.0, max_tokens=6, seed=seed + i, stop_token_ids=tok.eos_ids),
        )
        for i, p in enumerate(problems)
    ]
    outs = engine.generate(reqs)
    stops = set(tok.eos_ids)
    return [
        (p.prompt, [([t for t in o.token_ids if t not in stops], True)])
        for p, o in zip(problems, outs, strict=True)
        if o.finish_reason == "stop"
    ]


def engine_for(model: Decoder, tok: Tokenizer, batch: int, detokenize: Any) -> Any:
    """A TorchEngine serving a copy of ``model``'s weights (context: the model's)."""
    from pivotflow.engines.torch.engine import TorchEngine

    engine = TorchEngine(
        model.config, max_batch=batch, eos_token_id=tok.eos_id, detokenize=detokenize
    )
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:  # saved and loaded without the tied head
        state.pop("lm_head.weight", None)
    engine.load_weights(state, 0)
    return engine


def rollout_eval(
    model: Decoder, tok: Tokenizer, problems: Sequence[Problem], seed: int
) -> dict[str, Any]:
    """Sampled (temperature 1) multi-turn accuracy of ``model`` (with its tokenizer ``tok``) on
    ``problems``.

    Turn 1 stops at a stop token (``tok.eos_ids``) or as soon as the decoded text holds
    ``</tool_call>`` (the engine's stop string, checked on the decoded tail of the stream, so a
    tag split over several tokens stops it too); a turn holding a closed call has the
    calculator run in-process and its observation appended, then turn 2 is sampled from
    prompt + turn 1 + observation (two turns at most: a call in turn 2 is not run). The answer
    is the last turn's text, checked exactly.
    Returns accuracy, tool_rate (share that closed a call), tool_accuracy (accuracy among
    those), direct_accuracy (among the rest), malformed_calls (count of turns that opened a call
    that did not parse or run) and n.
    """
    task, parser = get_task("arithmetic"), HermesParser()
    engine = engine_for(model, tok, max(1, min(len(problems), 512)), tok.decode)
    context = model.config.context_limit

    def params(i: int, turn: int) -> SamplingParams:
        return SamplingParams(
            temperature=1.0,
            max_tokens=TURN_TOKENS,
            seed=seed + 7919 * turn + i,
            stop_token_ids=tok.eos_ids,
            stop_strings=parser.stop_strings,
        )

    prompts = [prompt_ids(tok, p.prompt) for p in problems]
    first = engine.generate(
        [GenerationRequest(str(i), ids, params(i, 0)) for i, ids in enumerate(prompts)]
    )
    texts: list[list[str]] = [[tok.decode(o.token_ids)] for o in first]
    called, malformed = [False] * len(problems), 0
    follow: list[GenerationRequest] = []
    for i, out in enumerate(first):
        text = texts[i][0]
        if not parser.call_closed(text):
            malformed += parser.open_tag in text  # opened, never closed within the turn
            continue
        results, ok = call_tool(text, parser)
        called[i], malformed = True, malformed + (not ok)
        history = (
            prompts[i] + out.token_ids + encode_observation(tok, observation_text(parser, results))
        )
        if len(history) < context:  # else no room: the call is the answer
            follow.append(GenerationRequest(str(i), history, params(i, 1)))
    second: list[GenerationOutput] = engine.generate(follow) if follow else []
    for out in second:
        texts[int(out.request_id)].append(tok.decode(out.token_ids))
    right = [task.check(p, answer_of(t)) for p, t in zip(problems, texts, strict=True)]
    tool = [r for r, c in zip(right, called, strict=True) if c]
    direct = [r for r, c in zip(right, called, strict=True) if not c]
    n = max(1, len(problems))
    return {
        "accuracy": sum(right) / n,
        "tool_rate": len(tool) / n,
        "tool_accuracy": sum(tool) / max(1, len(tool)),
        "direct_accuracy": sum(direct) / max(1, len(direct)),
        "malformed_calls": malformed,
        "n": len(problems),
    }
