"""SGLang behind the ``Engine`` interface: a thin adapter over ``sglang.Engine``.

UNTESTED in this repository: SGLang needs a GPU and is not installed where pivotflow is
developed, so this file is written against SGLang's documented offline API (``Engine.generate``
with ``input_ids`` and ``return_logprob``, ``update_weights_from_tensor``,
``release_memory_occupation`` / ``resume_memory_occupation``) and has never run here.

SGLang's offline engine has no public per-step API, so each ``step()`` hands every waiting request
to one blocking ``generate`` call (SGLang batches them continuously inside) and returns them all
finished. Consequences: nothing is ever running between steps, so ``abort`` only returns waiting
requests (as their prefix state); a request added during a step waits for the next one. As with
vLLM, a sampled request resumed from a prefix does not repeat an uninterrupted run's draws.
"""

from __future__ import annotations

from typing import Any

import torch

from pivotflow.engines.base import FinishReason, GenerationOutput, GenerationRequest
from pivotflow.errors import EngineError, RequestError

_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def _import_sglang() -> Any:
    try:
        import sglang
    except ImportError as exc:
        raise EngineError("sglang is not installed; pip install 'pivotflow[sglang]'") from exc
    return sglang


class SglangEngine:
    """``model_path`` is an HF checkpoint directory; ``engine_kwargs`` go to ``sglang.Engine``.
    Raises EngineError when SGLang is not installed."""

    def __init__(self, model_config: Any, *, model_path: str, **engine_kwargs: Any) -> None:
        sglang = _import_sglang()
        self.config = model_config
        self.version = 0
        engine_kwargs.setdefault("skip_tokenizer_init", True)
        self._no_tokenizer = bool(engine_kwargs["skip_tokenizer_init"])
        self._engine = sglang.Engine(model_path=model_path, **engine_kwargs)
        self._waiting: dict[str, GenerationRequest] = {}

    def add_request(self, request: GenerationRequest) -> None:
        """Queue ``request``; raises RequestError for a duplicate id or what SGLang cannot do."""
        rid, p = request.request_id, request.params
        if rid in self._waiting:
            raise RequestError(f"request {rid!r}: duplicate request_id")
        if p.stop_strings and self._no_tokenizer:
            raise RequestError(f"request {rid!r}: stop_strings need SGLang's tokenizer")
        if not request.prompt_ids or p.max_tokens - len(request.prefix_ids) <= 0:
            raise RequestError(f"request {rid!r}: empty prompt or no tokens left to generate")
        self._waiting[rid] = request

    def step(self) -> list[GenerationOutput]:
        """Generate every waiting request to completion in one SGLang call."""
        if not self._waiting:
            return []
        reqs, self._waiting = list(self._waiting.values()), {}
        params = []
        for r in reqs:
            p = r.params
            sp: dict[str, Any] = {
                "temperature": p.temperature,
                "top_p": p.top_p,
                "max_new_tokens": p.max_tokens - len(r.prefix_ids),
                "min_new_tokens": max(0, p.min_tokens - len(r.prefix_ids)),
                "stop_token_ids": list(p.stop_token_ids),
            }
            if p.stop_strings:
                sp["stop"] = list(p.stop_strings)
                sp["no_stop_trim"] = True  # a tool call's close tag is the policy's token
            if p.seed is not None:
                sp["sampling_seed"] = p.seed
            params.append(sp)
        results = self._engine.generate(
            input_ids=[list(r.prompt_ids) + list(r.prefix_ids) for r in reqs],
            sampling_params=params,
            return_logprob=True,
        )
        return [self._output(r, res) for r, res in zip(reqs, results, strict=True)]

    def has_work(self) -> bool:
        return bool(self._waiting)

    def abort(self, request_id: str) -> GenerationOutput | None:
        """Drop a waiting request; return its prefix state (None if unknown)."""
        req = self._waiting.pop(request_id, None)
        if req is None:
            return None
        return GenerationOutput(
            req.request_id,
            list(req.prompt_ids),
            list(req.prefix_ids),
            list(req.prefix_logprobs),
            list(req.prefix_versions),
            "abort",
        )

    def abort_all(self) -> list[GenerationOutput]:
        return [o for o in (self.abort(r) for r in list(self._waiting)) if o is not None]

    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        """Push HF-named tensors into SGLang (``update_weights_from_tensor``)."""
        self._engine.update_weights_from_tensor(named_tensors=list(tensors.items()))
        self.version = version

    def release_memory(self) -> None:
        self._engine.release_memory_occupation()

    def resume_memory(self) -> None:
        self._engine.resume_memory_occupation()

    def _output(self, req: GenerationRequest, res: dict[str, Any]) -> GenerationOutput:
        meta = res.get("meta_info", {})
        # output_token_logprobs holds (logprob, token_id, text) per generated token.
        new_logprobs = [float(lp) for lp, *_ in meta.get("output_token_logprobs", [])]
        new_ids = list(res.get("output_ids", []))
        reason = (meta.get("finish_reason") or {}).get("type", "")
        return GenerationOutput(
            request_id=req.request_id,
            prompt_ids=list(req.prompt_ids),
            token_ids=list(req.prefix_ids) + new_ids,
            logprobs=list(req.prefix_logprobs) + new_logprobs,
            versions=list(req.prefix_versions) + [self.version] * len(new_ids),
            finish_reason=_REASONS.get(reason, "error"),
        )
