"""A worker's settings, typed, with their one default each (from ``pivotflow.defaults``).

They travel flat in ``AssignRole.options`` beside the trainer's knobs (``TrainConfig``) and
the model folder a role reads its tokenizer from; the controller's side composes them from
the run's configuration (``RunConfig.worker``), a role reads them back here. torch-free: the
control plane imports it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pivotflow import defaults


class WorkerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What every role of a pool's workers is told: how to run its model, where its tokenizer
    lies, how to frame its results."""

    threads: int = defaults.THREADS_PER_WORKER
    max_batch: int = defaults.MAX_BATCH  # sequences a generate role decodes side by side
    engine: str = defaults.ENGINE
    seed: int = 0
    results_per_frame: int = defaults.RESULTS_PER_FRAME
    dtype: str = defaults.DTYPE
    device: str = defaults.DEVICE
    tokenizer_dir: str = ""  # the model's folder, when it has one ("" for a built-in)
    # a vLLM or SGLang engine's tensor parallelism (vLLM's tensor_parallel_size, SGLang's
    # tp_size): over the worker's GPUs (gpus_per_worker), or CPU processes
    tensor_parallel: int = 1
    # a generate role records its mixture-of-experts routing for the trainer to replay (a
    # generate stage's routing_replay; the embedded engine only)
    record_routing: bool = False

    def options(self) -> dict[str, Any]:
        """The flat form AssignRole carries (an empty tokenizer_dir left out)."""
        out = msgspec.structs.asdict(self)
        if not self.tokenizer_dir:
            del out["tokenizer_dir"]
        return out


def worker_config(options: dict[str, Any]) -> WorkerConfig:
    """The worker's settings among a role's options (the rest are the trainer's knobs);
    raises msgspec.ValidationError for one of the wrong type."""
    return msgspec.convert({k: v for k, v in options.items()
                            if k in WorkerConfig.__struct_fields__}, WorkerConfig, strict=False)
