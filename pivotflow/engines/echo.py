"""EchoEngine: an engine with no model, for measuring the control plane alone.

``bench/controller.py`` runs the controller against workers whose engine answers every request
at its next step with ``max_tokens`` copies of the prompt's last token (logprob 0). It implements
the whole Engine interface (continuous admission, abort with partial state, versions) so the
controller, transport and worker loop run exactly as with a model. It is selected only by
``--set engine=echo``; nothing picks it by default.
"""

from __future__ import annotations

import torch

from pivotflow.engines.base import GenerationOutput, GenerationRequest
from pivotflow.errors import RequestError


class EchoEngine:
    def __init__(self, *_: object, **__: object) -> None:
        self.version = 0
        self._waiting: dict[str, GenerationRequest] = {}

    def add_request(self, request: GenerationRequest) -> None:
        if not request.prompt_ids:
            raise RequestError(f"request {request.request_id}: empty prompt")
        if request.params.max_tokens <= 0:
            raise RequestError(f"request {request.request_id}: max_tokens must be > 0")
        self._waiting[request.request_id] = request

    def _finish(self, r: GenerationRequest, reason: str, n: int) -> GenerationOutput:
        new = max(0, n - len(r.prefix_ids))
        return GenerationOutput(
            r.request_id, r.prompt_ids, r.prefix_ids + [r.prompt_ids[-1]] * new,
            r.prefix_logprobs + [0.0] * new, r.prefix_versions + [self.version] * new,
            reason)  # type: ignore[arg-type]

    def step(self) -> list[GenerationOutput]:
        done = [self._finish(r, "length", r.params.max_tokens) for r in self._waiting.values()]
        self._waiting.clear()
        return done

    def has_work(self) -> bool:
        return bool(self._waiting)

    def abort(self, request_id: str) -> GenerationOutput | None:
        r = self._waiting.pop(request_id, None)
        return None if r is None else self._finish(r, "abort", len(r.prefix_ids))

    def abort_all(self) -> list[GenerationOutput]:
        return [o for rid in list(self._waiting) if (o := self.abort(rid)) is not None]

    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        self.version = version

    def release_memory(self) -> None:
        self._waiting.clear()

    def resume_memory(self) -> None:
        pass
