"""Multi-turn rollouts with tool calls: one generate stage's turns, calls and observations.

A sample's trajectory so far lives in its fields as token ids (``response_ids``) with
``logprobs``, ``versions`` and a ``loss_mask`` (1 on policy tokens, 0 on observations), so a
checkpoint saves it and any worker can run the next turn: each turn is a job whose prompt is the
prompt plus the trajectory so far, and a turn cut short (a migration, a checkpoint) resumes from
its partial tokens like any job. Nothing is ever re-tokenized from text: policy tokens are the
engine's, observation tokens are the only text encoded here (by the model's tokenizer). A
turn's text is decoded in the context of the trajectory before it (``turn_text``), so a
byte-level BPE token that completes a character begun in an earlier turn decodes right; a
``</tool_call>`` split over tokens is seen whole. Layout: ``tools/trajectory.py``.

Pure bookkeeping on samples; the controller owns the tool pool's calls and the queues.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pivotflow.controller.sample import Sample
from pivotflow.graph import Node
from pivotflow.protocol import GenerateJob, JobDone
from pivotflow.tokenizer.base import Tokenizer
from pivotflow.tools.parsers import ToolCall, make_parser
from pivotflow.tools.pool import ToolResult
from pivotflow.tools.trajectory import encode_observation, observation_text, turn_text

AWAITING = "_awaiting_tool"  # the last turn's calls have not been answered yet
TURN_TEXT = "_turn_text"  # that turn's text, to parse its calls again after a resume
Calls = list[ToolCall] | Any  # ... or the ToolCallError of a malformed call


class ToolTurns:
    """The turn logic of one generate stage declared with ``tools=``."""

    def __init__(self, node: Node, tok: Tokenizer) -> None:
        opts = node.options
        self.node, self.tok = node, tok
        self.parser = make_parser(opts["tool_parser"])
        self.max_turns = int(opts["max_turns"])
        self.max_total = opts["max_total_tokens"]
        self.stop_strings = list(self.parser.stop_strings)

    def job(self, base: GenerateJob, sample: Sample) -> GenerateJob:
        """``base`` (the stage's job for the sample) as the next turn: after the trajectory so
        far, stopping when a call closes, within what is left of the token budget."""
        traj = sample.fields.get("response_ids") if sample.fields.get("turns") else None
        max_tokens = base.max_tokens
        if self.max_total is not None:
            max_tokens = max(1, min(max_tokens, self.max_total - len(traj or ())))
        return msgspec.structs.replace(
            base, prompt_ids=base.prompt_ids + list(traj) if traj else base.prompt_ids,
            stop_strings=self.stop_strings, max_tokens=max_tokens)

    def on_turn(self, sample: Sample, r: JobDone) -> Calls | None:
        """Append a finished turn. Returns the calls to run (a list, or the parse error as one
        failed call) or None when the trajectory is complete (its fields are then final)."""
        f = sample.fields
        if not f.get("turns"):  # the first turn starts the trajectory
            f.update(response_ids=[], logprobs=[], versions=[], loss_mask=[], turns=0,
                     tool_calls=0, tool_errors=0)
        text = turn_text(self.tok, f["response_ids"], r.token_ids)
        f["response_ids"] += r.token_ids
        f["logprobs"] += r.logprobs
        f["versions"] += r.versions
        f["loss_mask"] += [1] * len(r.token_ids)
        if r.routing:  # each turn prefills the whole trajectory so far: the last turn's covers it
            f["routing"] = r.routing
        f["turns"] += 1
        room = self.max_total is None or len(f["response_ids"]) < self.max_total
        if (r.finish_reason == "stop" and not r.error and f["turns"] < self.max_turns and room
                and self.parser.call_closed(text)):
            sample.private.update({AWAITING: True, TURN_TEXT: text})
            return self.pending_calls(sample)
        self._finish(sample, r.finish_reason, text)
        return None

    def pending_calls(self, sample: Sample) -> Calls:
        """The calls of the turn that awaits its observation (parsed from its text)."""
        return self.parser.parse(sample.private[TURN_TEXT])

    def on_observation(self, sample: Sample, results: list[ToolResult]) -> bool:
        """Append the tool results as observation tokens (mask 0). True: the sample goes on to
        its next turn; False: the observation leaves no room for one within
        ``max_total_tokens``, so the trajectory ends at the call (finish reason "length")."""
        f = sample.fields
        f["tool_calls"] += len(results)
        f["tool_errors"] += sum(not r.ok for r in results)
        ids = encode_observation(self.tok, observation_text(self.parser, results))
        if self.max_total is not None and len(f["response_ids"]) + len(ids) >= self.max_total:
            text = sample.private.pop(TURN_TEXT)
            del sample.private[AWAITING]
            self._finish(sample, "length", text)
            return False
        last_version = f["versions"][-1] if f["versions"] else 0
        f["response_ids"] += ids
        f["logprobs"] += [0.0] * len(ids)  # not the policy's: masked out of the loss
        f["versions"] += [last_version] * len(ids)  # as of the turn that made the call
        f["loss_mask"] += [0] * len(ids)
        del sample.private[AWAITING], sample.private[TURN_TEXT]
        return True

    def _finish(self, sample: Sample, reason: str, text: str) -> None:
        f = sample.fields
        f.update(response=text, completion=text, finish_reason=reason,
                 trajectory=self.tok.decode(f["response_ids"]))
