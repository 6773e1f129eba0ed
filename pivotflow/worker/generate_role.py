"""The generate role: an inference engine serving rollout or judge jobs for one model."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from pivotflow.engines import make_engine
from pivotflow.engines.base import GenerationOutput, GenerationRequest, SamplingParams
from pivotflow.engines.torch.model import ModelConfig
from pivotflow.errors import CheckpointError, RequestError
from pivotflow.params.base import ParamStore
from pivotflow.protocol import GenerateJob, JobDone
from pivotflow.tasks.tokenizer import CharTokenizer


def _export(config: ModelConfig, tensors: dict) -> Path:
    """An HF checkpoint folder of these weights, for engines that load from a path."""
    from pivotflow.engines.torch.weights import save_checkpoint

    path = Path(tempfile.mkdtemp(prefix="pivotflow-export-"))
    save_checkpoint(path, config, tensors)
    return path


def _done(out: GenerationOutput, arrived: dict[int, float], now: float) -> JobDone:
    job_id = int(out.request_id)
    return JobDone(job_id=job_id, token_ids=out.token_ids, logprobs=out.logprobs,
                   versions=out.versions, finish_reason=out.finish_reason,
                   error=out.error or "", worker_s=now - arrived.pop(job_id, now))


class GenerateRole:
    """Continuous batching over jobs; picks up newer weights before starting a job that needs
    them (tokens already generated keep the version stamped on them)."""

    def __init__(self, store: ParamStore, model: str, options: dict) -> None:
        self.store, self.model = store, model
        t0 = time.perf_counter()
        version, config, tensors = store.load(model)
        kind = str(options.get("engine", "torch"))
        if kind in ("vllm", "sglang"):  # they load a checkpoint folder themselves
            engine_kw: dict = {"model_path": str(_export(config, tensors))}
        else:
            engine_kw = {"max_batch": int(options.get("max_batch", 64)), "eos_token_id": 2}
            if kind == "torch" and "tokenizer" in options:  # to match stop strings
                tok = CharTokenizer.from_dict(json.loads(options["tokenizer"]))
                engine_kw["detokenize"] = tok.decode
        t_engine = time.perf_counter()
        self.engine = make_engine(kind, config, **engine_kw)
        self.warmup_s = time.perf_counter() - t_engine
        self.engine.load_weights(tensors, version)
        self.load_s = time.perf_counter() - t0
        self.arrived: dict[int, float] = {}  # job id -> when its Jobs frame was handled

    @property
    def version(self) -> int:
        return self.engine.version

    def _refresh(self, min_version: int) -> None:
        for _ in range(3):  # the store may collect a version between LATEST and the read
            try:
                version, _, tensors = self.store.load(self.model)
                break
            except CheckpointError:
                time.sleep(0.05)
        else:
            version, _, tensors = self.store.load(self.model)
        if version < min_version:
            raise CheckpointError(f"{self.model}@v{min_version} was asked for but the store's "
                                  f"latest is v{version}")
        self.engine.load_weights(tensors, version)

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
        self.engine.release_memory()
        self.arrived.clear()
