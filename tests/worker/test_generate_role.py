"""The generate role on the echo engine: how long it held each job, and what it sends back."""

from __future__ import annotations

import time
from pathlib import Path

from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.protocol import GenerateJob, JobDone, JobsDone
from pivotflow.transport.codec import decode_to_controller, encode
from pivotflow.worker.generate_role import GenerateRole

CFG = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1)


def role(tmp_path: Path) -> GenerateRole:
    store = ShmParamStore(tmp_path / "store")
    store.publish("judge", 0, Decoder(CFG).state_dict(), CFG)
    return GenerateRole(store, "judge", {"engine": "echo"})


def job(i: int) -> GenerateJob:
    return GenerateJob(job_id=i, prompt_ids=[3, 4, 5], max_tokens=2)


def test_each_result_says_how_long_the_worker_held_its_job(tmp_path: Path) -> None:
    r = role(tmp_path)
    t0 = time.perf_counter()
    assert r.add([job(1), job(2)]) == []
    time.sleep(0.01)
    done = r.step()
    held = time.perf_counter() - t0
    assert sorted(d.job_id for d in done) == [1, 2]
    assert all(0.01 <= d.worker_s <= held for d in done)
    # it travels: a frame decodes with it, and an old frame without it reads as 0
    [back] = decode_to_controller(encode(JobsDone(results=done[:1]))).results  # type: ignore[attr-defined]
    assert back.worker_s == done[0].worker_s
    assert JobDone(job_id=1, token_ids=[], logprobs=[], versions=[],
                   finish_reason="stop").worker_s == 0.0
    assert r.arrived == {}


def test_aborted_and_rejected_jobs_leave_nothing_behind(tmp_path: Path) -> None:
    r = role(tmp_path)
    bad = GenerateJob(job_id=3, prompt_ids=[], max_tokens=2)  # the echo engine refuses it
    [rejected] = r.add([job(1), bad])
    assert rejected.job_id == 3 and rejected.finish_reason == "error"
    [aborted] = r.abort([1])
    assert aborted.finish_reason == "abort" and aborted.worker_s >= 0
    assert r.arrived == {}
