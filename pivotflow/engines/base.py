"""The engine interface every inference backend implements (torch, vLLM, SGLang).

It is shaped after vLLM's AsyncLLM (add/abort/sleep/wake_up/collective_rpc) and SGLang's Engine
(abort, update_weights_from_tensor, release/resume_memory_occupation) so both fit behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to sample. ``seed`` makes a request reproducible wherever it runs and resumes."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None
    min_tokens: int = 0  # no stop token (EOS included) before this many response tokens


@dataclass(slots=True)
class GenerationRequest:
    """One sequence to generate. ``prefix_*`` resume a sequence another engine started: the
    engine continues after ``prefix_ids`` without resampling them."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    prefix_ids: list[int] = field(default_factory=list)
    prefix_logprobs: list[float] = field(default_factory=list)
    prefix_versions: list[int] = field(default_factory=list)


@dataclass(slots=True)
class GenerationOutput:
    """A finished (or aborted) sequence: generated tokens with their logprobs and the policy
    version that produced each. On abort these are the partial state to resume from."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    error: str | None = None
    # an engine that records routing (a mixture of experts, for routing replay): the expert ids
    # of every sparse layer at each position it fed, prompt and response but the last token
    # (``engines.torch.model.routing_from_bytes`` reads them); empty otherwise
    routing: bytes = b""


class Engine(Protocol):
    """An inference engine that batches continuously."""

    version: int

    def add_request(self, request: GenerationRequest) -> None:
        """Queue a request; it joins the running batch at the next step.
        Raises RequestError for an invalid request (the engine keeps serving the others)."""
        ...

    def step(self) -> list[GenerationOutput]:
        """Run one scheduling step (admit, prefill, one decode); return requests that finished."""
        ...

    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        ...

    def abort(self, request_id: str) -> GenerationOutput | None:
        """Stop one request and return its partial state (None if unknown or finished)."""
        ...

    def abort_all(self) -> list[GenerationOutput]:
        """Stop every request and return their partial states."""
        ...

    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        """Replace the weights (HF tensor names) and stamp later tokens with ``version``."""
        ...

    def release_memory(self) -> None:
        """Free the KV cache and weights (the role is leaving this worker)."""
        ...

    def resume_memory(self) -> None:
        """Re-acquire what release_memory freed (weights must be loaded again)."""
        ...
