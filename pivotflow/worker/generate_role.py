"""The generate role: an inference engine serving rollout or judge jobs for one model.

The store hands over the model's Hugging Face config as a dict; the embedded engine builds its
own description from it (``config_from_hf``), vLLM and SGLang read it from an exported folder.
Options the controller sets: ``engine``, ``max_batch``, ``device`` (default cpu), ``dtype``
("auto": the config's), and ``tokenizer_dir``: the model's tokenizer folder, which gives the
embedded engine its stop tokens (eos and generation_config's) and the text that stop strings
are matched against. Without it stop strings are refused and jobs bring their own stop ids.

vLLM starts from a folder holding only the config and the tokenizer (``load_format="dummy"``)
and takes every version, the first included, from the store inside its own worker
(``engines.load_version``); ``max_batch`` is its ``max_num_seqs``. Releasing the role shuts an
engine that can be shut down (vLLM: its engine core and worker processes) and removes the export.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from pivotflow.engines import load_version, make_engine
from pivotflow.engines.base import GenerationOutput, GenerationRequest, SamplingParams
from pivotflow.errors import ModelConfigError, RequestError
from pivotflow.params.base import VERSION_WAIT_S, ParamStore, load_newer
from pivotflow.params.hf_folder import CONFIG, copy_side_files, write_folder
from pivotflow.protocol import GenerateJob, JobDone
from pivotflow.worker.worker_config import WorkerConfig, worker_config


def _export(config: dict[str, Any], tensors: dict, tokenizer_dir: str | None) -> Path:
    """An HF folder of these weights and this config (with the tokenizer's files, when given),
    for engines that load from a path."""
    path = Path(tempfile.mkdtemp(prefix="pivotflow-export-"))
    write_folder(path, config, tensors, side_files_from=tokenizer_dir)
    return path


def _vllm_engine(config: dict[str, Any], wc: WorkerConfig, where: str) -> dict[str, Any]:
    """vLLM's constructor arguments: a folder of the config and tokenizer (no weights: they come
    from the store), the run's dtype, batch and seed."""
    from pivotflow.engines.torch.weights import resolve_dtype

    path = Path(tempfile.mkdtemp(prefix="pivotflow-export-"))
    (path / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    if wc.tokenizer_dir:
        copy_side_files(wc.tokenizer_dir, path)
    dtype = resolve_dtype(config, wc.dtype, where)
    return {"model_path": str(path), "load_format": "dummy",
            "dtype": str(dtype).removeprefix("torch."), "max_num_seqs": wc.max_batch,
            "seed": wc.seed, "threads": wc.threads,
            **({"tensor_parallel_size": wc.tensor_parallel} if wc.tensor_parallel > 1 else {})}


def _torch_engine(config: dict[str, Any], wc: WorkerConfig, where: str) -> tuple[Any, dict]:
    """The embedded engine's model description and constructor arguments."""
    from pivotflow.engines.torch.weights import config_from_hf, resolve_dtype

    cfg = config_from_hf(config, where)
    kw: dict[str, Any] = {"max_batch": wc.max_batch, "device": wc.device,
                          "dtype": resolve_dtype(config, wc.dtype, where),
                          "record_routing": wc.record_routing}
    tokenizer_dir = wc.tokenizer_dir
    if tokenizer_dir:
        from pivotflow.tokenizer import load_tokenizer

        tok = load_tokenizer(tokenizer_dir)
        if tok.vocab_size > cfg.vocab_size:
            raise ModelConfigError(
                f"tokenizer {tokenizer_dir} has {tok.vocab_size} ids but {where} has "
                f"vocab_size {cfg.vocab_size}"
            )
        # Special tokens print too: a stop string or a tag that is an added token is matched.
        kw["detokenize"] = lambda ids: tok.decode(ids, skip_special=False)
        kw["eos_token_ids"] = tuple(tok.eos_ids)
        # Qwen2.5 and Llama pad the embedding past the tokenizer: ids above it have no text.
        if tok.vocab_size < cfg.vocab_size:
            kw["vocab_limit"] = tok.vocab_size
    return cfg, kw


def _done(out: GenerationOutput, arrived: dict[int, float], now: float) -> JobDone:
    job_id = int(out.request_id)
    return JobDone(job_id=job_id, token_ids=out.token_ids, logprobs=out.logprobs,
                   versions=out.versions, finish_reason=out.finish_reason,
                   error=out.error or "", worker_s=now - arrived.pop(job_id, now),
                   routing=out.routing)


class GenerateRole:
    """Continuous batching over jobs; picks up newer weights before starting a job that needs
    them (tokens already generated keep the version stamped on them)."""

    def __init__(self, store: ParamStore, model: str, options: dict) -> None:
        self.store, self.model = store, model
        t0 = time.perf_counter()
        version, config, tensors = store.load(model)
        wc = worker_config(options)
        kind = wc.engine
        if wc.record_routing and kind != "torch":
            raise ValueError(f"routing_replay needs the embedded engine (engine=torch), not "
                             f"{kind!r}: pivotflow does not read {kind}'s routed experts yet")
        model_config: Any = config
        engine_kw: dict[str, Any] = {}
        where = f"config of {model}@v{version} (parameter store {store.root})"
        if kind == "vllm":
            engine_kw = _vllm_engine(config, wc, where)
        elif kind == "sglang":  # loads a checkpoint folder itself
            engine_kw["model_path"] = str(_export(config, tensors, wc.tokenizer_dir or None))
            if wc.tensor_parallel > 1:
                engine_kw["tp_size"] = wc.tensor_parallel
        elif kind == "torch":
            model_config, engine_kw = _torch_engine(config, wc, where)
        self.export = engine_kw.get("model_path")
        t_engine = time.perf_counter()
        self.engine = make_engine(kind, model_config, **engine_kw)
        self.warmup_s = time.perf_counter() - t_engine
        if kind == "vllm":  # the worker maps the store itself; the tensors read above go unused
            del tensors
            load_version(self.engine, store, model, version)
        else:
            self.engine.load_weights(tensors, version)
        self.load_s = time.perf_counter() - t0
        self.arrived: dict[int, float] = {}  # job id -> when its Jobs frame was handled

    @property
    def version(self) -> int:
        return self.engine.version

    def _refresh(self, min_version: int) -> None:
        load_newer(self.store, self.model, min_version,
                   lambda: load_version(self.engine, self.store, self.model), VERSION_WAIT_S)

    def add(self, jobs: list[GenerateJob]) -> list[JobDone]:
        """Queue jobs; returns at once the ones rejected as bad requests (with their error)."""
        now = time.perf_counter()
        for j in jobs:
            self.arrived[j.job_id] = now
        need = max((j.min_version for j in jobs), default=0)
        if need > self.engine.version:
            self._refresh(need)
        rejected = []
        for j in jobs:
            params = SamplingParams(temperature=j.temperature, top_p=j.top_p,
                                    max_tokens=j.max_tokens,
                                    stop_token_ids=tuple(j.stop_token_ids),
                                    stop_strings=tuple(j.stop_strings),
                                    seed=None if j.seed < 0 else j.seed,
                                    min_tokens=j.min_tokens)
            req = GenerationRequest(str(j.job_id), list(j.prompt_ids), params,
                                    list(j.prefix_ids), list(j.prefix_logprobs),
                                    list(j.prefix_versions))
            try:
                self.engine.add_request(req)
            except RequestError as exc:
                self.arrived.pop(j.job_id, None)
                rejected.append(JobDone(job_id=j.job_id, token_ids=list(j.prefix_ids),
                                        logprobs=list(j.prefix_logprobs),
                                        versions=list(j.prefix_versions),
                                        finish_reason="error", error=str(exc)))
        return rejected

    def has_work(self) -> bool:
        return self.engine.has_work()

    def step(self) -> list[JobDone]:
        outs = self.engine.step()
        now = time.perf_counter()
        return [_done(o, self.arrived, now) for o in outs]

    def abort(self, job_ids: list[int]) -> list[JobDone]:
        now = time.perf_counter()
        if not job_ids:
            return [_done(o, self.arrived, now) for o in self.engine.abort_all()]
        outs = (self.engine.abort(str(j)) for j in job_ids)
        return [_done(o, self.arrived, now) for o in outs if o is not None]

    def release(self) -> None:
        """Free the engine for good (the role is dropped): shut down an engine that has
        processes of its own (vLLM, SGLang), release the embedded one's memory."""
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()
        else:
            self.engine.release_memory()
        if self.export:
            shutil.rmtree(self.export, ignore_errors=True)
        self.arrived.clear()
