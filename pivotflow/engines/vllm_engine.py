"""vLLM behind the ``Engine`` interface: a thin adapter over ``vllm.LLM`` and its ``LLMEngine``.

UNTESTED in this repository: vLLM needs a GPU and is not installed where pivotflow is developed,
so this file is written against vLLM's documented API (``LLMEngine.add_request / step /
abort_request``, ``LLM.collective_rpc / sleep / wake_up``) and has never run here. Known gaps
against the embedded engine:

* A sampled (temperature > 0) request resumed from a prefix does not repeat the draws an
  uninterrupted run would make: vLLM seeds one generator per request, not per token. Greedy
  requests resume exactly.
* Logprobs are vLLM's sampled-token logprobs (``logprobs=0``); with vLLM's default
  ``logprobs_mode="raw_logprobs"`` they are, like ours, taken before temperature and top-p.
* Stop strings need vLLM's tokenizer; with ``skip_tokenizer_init=True`` (the default here,
  prompts are token ids) they are rejected.
"""

from __future__ import annotations

from typing import Any

import torch

from pivotflow.engines.base import FinishReason, GenerationOutput, GenerationRequest
from pivotflow.errors import EngineError, RequestError

_REASONS: dict[str | None, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise EngineError("vllm is not installed; pip install 'pivotflow[vllm]'") from exc
    return vllm


def _load_weights(worker: Any, items: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside each vLLM worker (via collective_rpc): vLLM's models take HF names."""
    worker.model_runner.model.load_weights(weights=items)


class VllmEngine:
    """Continuous batching by vLLM. ``model_path`` is an HF checkpoint directory (for example
    one written by ``weights.save_checkpoint``); ``engine_kwargs`` go to ``vllm.LLM``.
    Raises EngineError when vLLM is not installed."""

    def __init__(self, model_config: Any, *, model_path: str, **engine_kwargs: Any) -> None:
        self._vllm = _import_vllm()
        self.config = model_config
        self.version = 0
        engine_kwargs.setdefault("skip_tokenizer_init", True)
        engine_kwargs.setdefault("enable_sleep_mode", True)
        self._no_tokenizer = bool(engine_kwargs["skip_tokenizer_init"])
        self._llm = self._vllm.LLM(model=model_path, **engine_kwargs)
        self._engine = self._llm.llm_engine
        self._requests: dict[str, GenerationRequest] = {}
        self._state: dict[str, GenerationOutput] = {}  # latest partial output per request

    def add_request(self, request: GenerationRequest) -> None:
        """Queue ``request``; raises RequestError for a duplicate id or what vLLM cannot do."""
        rid, p = request.request_id, request.params
        if rid in self._requests:
            raise RequestError(f"request {rid!r}: duplicate request_id")
        if p.stop_strings and self._no_tokenizer:
            raise RequestError(f"request {rid!r}: stop_strings need vLLM's tokenizer")
        left = p.max_tokens - len(request.prefix_ids)
        if left <= 0 or not request.prompt_ids:
            raise RequestError(f"request {rid!r}: empty prompt or no tokens left to generate")
        params = self._vllm.SamplingParams(
            temperature=p.temperature, top_p=p.top_p, max_tokens=left, seed=p.seed,
            min_tokens=max(0, p.min_tokens - len(request.prefix_ids)),
            stop_token_ids=list(p.stop_token_ids), stop=list(p.stop_strings) or None,
            include_stop_str_in_output=True,  # a tool call's close tag is the policy's token
            logprobs=0, detokenize=not self._no_tokenizer)  # fmt: skip
        prompt = {"prompt_token_ids": list(request.prompt_ids) + list(request.prefix_ids)}
        try:
            self._engine.add_request(rid, prompt, params)
        except ValueError as exc:  # vLLM validates lengths and ids with ValueError
            raise RequestError(f"request {rid!r}: {exc}") from exc
        self._requests[rid] = request
        self._state[rid] = self._output(request, [], [], "abort")

    def step(self) -> list[GenerationOutput]:
        """One vLLM engine step; returns the requests that finished in it."""
        done = []
        for out in self._engine.step():
            req = self._requests.get(out.request_id)
            if req is None:
                continue
            comp = out.outputs[0]
            pairs = zip(comp.token_ids, comp.logprobs or [], strict=False)
            logprobs = [float(lp[t].logprob) for t, lp in pairs]
            prev = self._state[out.request_id]
            old = len(prev.token_ids) - len(req.prefix_ids)
            versions = prev.versions + [self.version] * (len(comp.token_ids) - old)
            reason = _REASONS.get(comp.finish_reason, "error") if out.finished else "abort"
            state = self._output(req, list(comp.token_ids), logprobs, reason, versions)
            self._state[out.request_id] = state
            if out.finished:
                done.append(state)
                self._forget(out.request_id)
        return done

    def has_work(self) -> bool:
        return bool(self._engine.has_unfinished_requests())

    def abort(self, request_id: str) -> GenerationOutput | None:
        """Abort in vLLM; return the tokens seen so far (None if unknown or finished)."""
        if request_id not in self._requests:
            return None
        self._engine.abort_request([request_id])
        state = self._state[request_id]
        self._forget(request_id)
        return state

    def abort_all(self) -> list[GenerationOutput]:
        return [o for o in (self.abort(r) for r in list(self._requests)) if o is not None]

    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        """Push HF-named tensors into every vLLM worker (``collective_rpc``)."""
        self._llm.collective_rpc(_load_weights, args=(list(tensors.items()),))
        self.version = version

    def release_memory(self) -> None:
        """vLLM sleep level 2: drop weights and KV cache."""
        self._llm.sleep(level=2)

    def resume_memory(self) -> None:
        self._llm.wake_up()

    def _forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        self._state.pop(request_id, None)

    def _output(
        self,
        req: GenerationRequest,
        new_ids: list[int],
        new_logprobs: list[float],
        reason: FinishReason,
        versions: list[int] | None = None,
    ) -> GenerationOutput:
        return GenerationOutput(
            request_id=req.request_id,
            prompt_ids=list(req.prompt_ids),
            token_ids=list(req.prefix_ids) + new_ids,
            logprobs=list(req.prefix_logprobs) + new_logprobs,
            versions=versions if versions is not None else list(req.prefix_versions),
            finish_reason=reason,
        )
