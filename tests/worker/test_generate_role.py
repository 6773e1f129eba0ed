"""The generate role: how long it held each job and what it sends back (echo engine), and the
embedded engine built from the store's HF config dict and the model folder's tokenizer."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.engines.torch.weights import config_to_hf, load_model_folder
from pivotflow.errors import ModelConfigError
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.protocol import GenerateJob, JobDone, JobsDone
from pivotflow.transport.codec import decode_to_controller, encode
from pivotflow.worker.generate_role import GenerateRole

CFG = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1)


def role(tmp_path: Path) -> GenerateRole:
    store = ShmParamStore(tmp_path / "store")
    store.publish("judge", 0, Decoder(CFG).state_dict(), config_to_hf(CFG, torch.float32))
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


def folder_role(tmp_path: Path, folder: Path, **options: object) -> GenerateRole:
    """A torch-engine role on a model folder, published as a run publishes it."""
    model = load_model_folder(folder)
    store = ShmParamStore(tmp_path / "store")
    store.publish("policy", 0, model.tensors, model.hf_config)
    return GenerateRole(store, "policy", {"engine": "torch", "max_batch": 4, **options})


def test_the_tokenizer_folder_gives_stop_tokens_and_stop_strings(
    tmp_path: Path, random_models: dict[str, Path]
) -> None:
    from pivotflow.tokenizer import load_tokenizer

    folder = random_models["policy"]
    eos = load_tokenizer(folder).eos_ids
    with_tok = folder_role(tmp_path / "a", folder, tokenizer_dir=str(folder))
    assert with_tok.engine.eos_token_ids == eos  # type: ignore[attr-defined]
    tok = load_tokenizer(folder)
    stops = ["1", "2", "3", "+"]
    stop = GenerateJob(job_id=7, prompt_ids=[5, 6, 7], max_tokens=24, stop_strings=stops)
    assert with_tok.add([stop]) == []
    while with_tok.has_work():
        done = with_tok.step()
    [out] = done
    text, before = (tok.decode(ids, skip_special=False)
                    for ids in (out.token_ids, out.token_ids[:-1]))
    # It stops on the token that completes a stop string or on an end-of-sequence token
    # (random weights sample one now and then), and on no other.
    ended = out.token_ids[-1] in eos or any(s in text for s in stops)
    assert out.finish_reason == ("stop" if ended else "length"), text
    assert not any(s in before for s in stops), before
    # Without a tokenizer: no stop strings, and only the job's own stop ids end it.
    bare = folder_role(tmp_path / "b", folder)
    assert bare.engine.eos_token_ids == ()  # type: ignore[attr-defined]
    [refused] = bare.add([stop])
    assert refused.finish_reason == "error" and "stop_strings" in refused.error


def test_dtype_comes_from_the_config_or_the_option(
    tmp_path: Path, random_models: dict[str, Path]
) -> None:
    folder = random_models["policy"]
    assert folder_role(tmp_path / "auto", folder).engine.dtype == torch.float32  # type: ignore[attr-defined]
    bf16 = folder_role(tmp_path / "bf16", folder, dtype="bfloat16")
    assert bf16.engine.dtype == torch.bfloat16  # type: ignore[attr-defined]
    assert bf16.add([job(1)]) == []
    while bf16.has_work():
        done = bf16.step()
    assert len(done[0].token_ids) == 2 and all(lp <= 0 for lp in done[0].logprobs)
    with pytest.raises(ModelConfigError, match="dtype='int8' is not one of auto"):
        folder_role(tmp_path / "bad", folder, dtype="int8")


def test_an_embedding_padded_past_the_tokenizer_never_yields_an_id_without_text(
    tmp_path: Path, random_models: dict[str, Path]
) -> None:
    """Qwen2.5 and Llama pad their embedding past the tokenizer; the role hands the engine the
    tokenizer's size, so a random model (which samples nearly uniformly) never draws a padded id."""
    import shutil

    from pivotflow.engines.torch.weights import save_checkpoint
    from pivotflow.tokenizer import load_tokenizer

    src = random_models["policy"]
    tok = load_tokenizer(src)
    folder = tmp_path / "padded"
    shutil.copytree(src, folder)
    model = load_model_folder(src)
    pad = 64
    cfg = dict(model.hf_config, vocab_size=model.config.vocab_size + pad)
    tensors = dict(model.tensors)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in tensors:
            t = tensors[name]
            tensors[name] = torch.cat([t, t[:pad] * 3.0])  # padded rows outscore real ones
    save_checkpoint(folder, cfg, tensors)
    r = folder_role(tmp_path / "store", folder, tokenizer_dir=str(folder))
    jobs = [GenerateJob(job_id=i, prompt_ids=[5, 6, 7], max_tokens=24, seed=i) for i in range(4)]
    assert r.add(jobs) == []
    done: list[JobDone] = []
    while len(done) < 4:
        done += r.step()
    ids = [t for d in done for t in d.token_ids]
    assert len(ids) > 24 and max(ids) < tok.vocab_size
    tok.decode(ids)  # every id has text
