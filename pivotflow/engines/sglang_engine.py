"""SGLang behind the ``Engine`` interface: an adapter over ``sglang.Engine`` (offline engine).

NOT RUN HERE: sglang 0.5.23 needs torch 2.14.1 with CUDA, so it cannot be installed on the CPU
machines pivotflow is developed and tested on. This file is written against the 0.5.23 wheel's
source (``srt/entrypoints/engine.py``, ``managers/tokenizer_manager.py``,
``managers/tokenizer_control_mixin.py``, ``managers/scheduler_components/weight_updater.py``,
``sampling/sampling_params.py``, ``layers/sampler.py``); ``bench/gpu_check.py`` is where it runs,
on a machine with a GPU. What that source says, and what this adapter does about it:

* **Continuous batching through asyncio**: each request is an ``Engine.async_generate`` task on
  the engine's own event loop (``engine.loop``), named by ``rid``; ``step()`` runs the loop until
  a task finishes or ``step_s`` passes and returns the finished ones.
* **Abort** lives on ``engine.tokenizer_manager.abort_request(rid=...)``; the aborted task then
  returns what was generated so far with ``finish_reason`` ``abort``.
* **Logprobs**: ``output_token_logprobs`` are taken *after* temperature unless
  ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` (read once when ``layers/sampler.py`` is imported, and
  inherited by the scheduler processes); the trainer's ratios need the raw ones, so it is set
  before sglang is imported and any other value is refused.
* **Seeds**: ``sampling_seed`` is ignored unless the engine runs with
  ``enable_deterministic_inference=True``; then a request without a seed would get SGLang's
  fixed 42 (every sample of a group the same), so it gets a fresh random seed here instead.
  Without deterministic inference a seed is not honoured (``seeded`` is False).
* **Release/resume** (``release_memory_occupation`` / ``resume_memory_occupation``) do nothing
  unless the engine runs with ``enable_memory_saver=True``, the default here; SGLang asserts the
  server is idle, so release with requests in flight is an EngineError.
* **Weights**: ``update_weights_from_tensor(named_tensors, load_format, flush_cache)`` must run
  between ``begin_weight_update()`` and ``end_weight_update()`` in 0.5.23 (outside, it returns
  ``success=False``). It returns ``(success, message)``; a failure is an EngineError.
  SGLang holds its model-update lock for a request's whole life, so an update waits for the
  requests in flight; this adapter waits for them first (they keep the old version), so every
  token of a request carries the version in force when the request was added.
* A request resumed from a prefix sends prompt + prefix as ``input_ids`` with
  ``max_new_tokens`` reduced; as with vLLM, a sampled continuation does not repeat an
  uninterrupted run's draws.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

import torch

from pivotflow.engines.base import FinishReason, GenerationOutput, GenerationRequest
from pivotflow.errors import EngineError, RequestError
from pivotflow.params.hf_layout import engine_names

_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_RAW_LOGPROBS = "SGLANG_RETURN_ORIGINAL_LOGPROB"


def _import_sglang() -> Any:
    os.environ.setdefault(_RAW_LOGPROBS, "1")
    if os.environ[_RAW_LOGPROBS].lower() not in ("1", "true"):
        raise EngineError(
            f"{_RAW_LOGPROBS}={os.environ[_RAW_LOGPROBS]!r} makes SGLang return logprobs after "
            "temperature; pivotflow's trainer needs the raw ones (unset it or set it to 1)"
        )
    try:
        import sglang
    except ImportError as exc:
        raise EngineError("sglang is not installed; pip install 'pivotflow[sglang]'") from exc
    return sglang


class SglangEngine:
    """``model_path`` is an HF checkpoint folder; ``engine_kwargs`` go to ``sglang.Engine``.
    Raises EngineError when SGLang is not installed."""

    def __init__(
        self, model_config: Any = None, *, model_path: str, step_s: float = 0.02,
        **engine_kwargs: Any,
    ) -> None:  # fmt: skip
        sglang = _import_sglang()
        self.config = model_config
        self.version = 0
        self.step_s = step_s
        folder = Path(model_path)
        try:  # (which checkpoint names its loader reads: Mixtral's are not pivotflow's)
            self._hf_config = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            self._hf_config = {}  # SGLang names a missing or broken config itself
        kw = dict(engine_kwargs)
        kw.setdefault("skip_tokenizer_init",
                      not any((folder / f).is_file() for f in _TOKENIZER_FILES))  # fmt: skip
        kw.setdefault("enable_memory_saver", True)
        self._no_tokenizer = bool(kw["skip_tokenizer_init"])
        self.seeded = bool(kw.get("enable_deterministic_inference", False))
        t0 = time.perf_counter()
        self._engine = sglang.Engine(model_path=str(folder), **kw)
        self.startup_s = time.perf_counter() - t0
        self.release_s = self.resume_s = self.update_s = 0.0
        self._loop: asyncio.AbstractEventLoop = self._engine.loop
        self._tasks: dict[str, asyncio.Task] = {}
        self._requests: dict[str, tuple[GenerationRequest, int]] = {}  # with the version then

    def add_request(self, request: GenerationRequest) -> None:
        """Start ``request`` in SGLang; raises RequestError for what SGLang cannot do (its own
        validation of the parameters then comes back as an ``error`` finish)."""
        rid, p = request.request_id, request.params
        if rid in self._requests:
            raise RequestError(f"request {rid!r}: duplicate request_id")
        if p.stop_strings and self._no_tokenizer:
            raise RequestError(f"request {rid!r}: stop_strings need SGLang's tokenizer")
        left = p.max_tokens - len(request.prefix_ids)
        if not request.prompt_ids or left <= 0:
            raise RequestError(f"request {rid!r}: empty prompt or no tokens left to generate")
        sp: dict[str, Any] = {
            "temperature": p.temperature,
            "top_p": p.top_p,
            "max_new_tokens": left,
            "min_new_tokens": max(0, p.min_tokens - len(request.prefix_ids)),
            "stop_token_ids": list(p.stop_token_ids),
        }
        if p.stop_strings:
            sp["stop"] = list(p.stop_strings)
            sp["no_stop_trim"] = True  # a tool call's close tag is the policy's token
        if self.seeded:
            sp["sampling_seed"] = p.seed if p.seed is not None else secrets.randbits(63)
        coro = self._engine.async_generate(
            input_ids=[*request.prompt_ids, *request.prefix_ids], sampling_params=sp,
            return_logprob=True, logprob_start_len=-1, rid=rid)  # fmt: skip
        self._tasks[rid] = self._loop.create_task(coro)
        self._requests[rid] = (request, self.version)

    def step(self) -> list[GenerationOutput]:
        """Run SGLang's loop until a request finishes (or ``step_s``); return the finished."""
        if not self._tasks:
            return []
        self._loop.run_until_complete(asyncio.wait(
            self._tasks.values(), timeout=self.step_s, return_when=asyncio.FIRST_COMPLETED))  # fmt: skip
        return [self._finish(rid) for rid, t in list(self._tasks.items()) if t.done()]

    def has_work(self) -> bool:
        return bool(self._tasks)

    def abort(self, request_id: str) -> GenerationOutput | None:
        """Abort in SGLang and return what it had generated (None if unknown or finished)."""
        task = self._tasks.get(request_id)
        if task is None:
            return None
        self._engine.tokenizer_manager.abort_request(rid=request_id)
        self._loop.run_until_complete(asyncio.wait([task]))
        out = self._finish(request_id)
        out.finish_reason = "abort"
        return out

    def abort_all(self) -> list[GenerationOutput]:
        return [o for o in (self.abort(r) for r in list(self._tasks)) if o is not None]

    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        """Wait for the requests in flight (they keep the old version), then push HF-named
        tensors in one weight-update session. Raises EngineError when SGLang reports failure."""
        t0 = time.perf_counter()
        if self._tasks:
            self._loop.run_until_complete(asyncio.wait(list(self._tasks.values())))
        self._engine.begin_weight_update()
        try:
            ok, message = self._engine.update_weights_from_tensor(
                named_tensors=list(engine_names(self._hf_config, tensors).items()),
                load_format=None, flush_cache=True)  # fmt: skip
        finally:
            self._engine.end_weight_update()
        if not ok:
            raise EngineError(f"SGLang refused the weights of version {version}: {message}")
        self.version = version
        self.update_s = time.perf_counter() - t0

    def release_memory(self) -> None:
        """Free weights, KV cache and CUDA graphs (needs ``enable_memory_saver``)."""
        if self._tasks:
            raise EngineError(f"release_memory with {len(self._tasks)} requests in flight; "
                              "abort them first")  # fmt: skip
        t0 = time.perf_counter()
        self._engine.release_memory_occupation()
        self.release_s = time.perf_counter() - t0

    def resume_memory(self) -> None:
        t0 = time.perf_counter()
        self._engine.resume_memory_occupation()
        self.resume_s = time.perf_counter() - t0

    def shutdown(self) -> None:
        self._engine.shutdown()

    def _finish(self, rid: str) -> GenerationOutput:
        """The output of a done task; its finished steps collected (done() is True)."""
        task = self._tasks.pop(rid)
        req, version = self._requests.pop(rid)
        try:
            res = task.result()
        except Exception as exc:  # SGLang's validation (SamplingParams.verify) raises here
            return GenerationOutput(rid, list(req.prompt_ids), list(req.prefix_ids),
                                    list(req.prefix_logprobs), list(req.prefix_versions),
                                    "error", error=" ".join(str(exc).split()))  # fmt: skip
        meta = res.get("meta_info", {})
        # output_token_logprobs holds (logprob, token_id, text) per generated token.
        new_logprobs = [float(lp) for lp, *_ in meta.get("output_token_logprobs") or []]
        new_ids = list(res.get("output_ids") or [])
        reason = (meta.get("finish_reason") or {}).get("type", "")
        return GenerationOutput(
            request_id=rid,
            prompt_ids=list(req.prompt_ids),
            token_ids=[*req.prefix_ids, *new_ids],
            logprobs=[*req.prefix_logprobs, *new_logprobs],
            versions=[*req.prefix_versions, *[version] * len(new_ids)],
            finish_reason=_REASONS.get(reason, "error"),
        )
