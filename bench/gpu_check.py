"""One prepared GPU check: the embedded engine, vLLM and SGLang on a Qwen2.5-0.5B-shaped model.

    python bench/gpu_check.py [--new-tokens 128] [--prompt-len 64] [--part-timeout 200]

Without a CUDA device it prints ``{"skipped": "no CUDA device"}`` and exits 0. With one, it writes
a random-weight Qwen2 of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads of 64, 2 KV heads,
intermediate 4864, vocab 151936, tied; 494M parameters) in bf16 with transformers, publishes it to
the parameter store (``ShmParamStore.publish(name, version, tensors, hf_config_dict)``) beside a
host memcpy of the same bytes, then runs each engine in its own child process (a crash or hang of
one leaves the others' figures; an engine that is not importable gets an entry saying so):

* greedy decode tokens/s at batch 64 (``--new-tokens`` each, no EOS, best of 2 after a warm-up);
* the weight update from the store: map the stored version, copy it into the engine (embedded:
  ``load_weights``; vLLM: a worker extension called through ``collective_rpc`` that reads the
  store inside vLLM's worker, then ``reset_prefix_cache``; SGLang: ``update_weights_from_tensor``
  with ``flush_cache``), beside a host-to-device memcpy of the same bytes;
* release/resume: embedded ``release_memory``/``resume_memory`` + reload from the store, vLLM
  ``sleep(level=1)``/``wake_up()``, SGLang ``release_memory_occupation``/
  ``resume_memory_occupation`` (``enable_memory_saver``) + reload, each checked by greedy tokens
  equal to those before.

``zero``: ``bench/zero_optimizer.py --device cuda`` at the model's 24 layers, two trainers on
the one GPU: the sharded optimizer's collectives over gloo on CUDA tensors (never run before on
a GPU), each layout's allocator peak and step.

``fork``: ``bench/worker_start.py --device cuda --repeats 1 --steps 2``: real runs of the main
job on the GPU with workers forked from the local launcher's zygote and exec'd (never run
forked on a GPU: ``worker_start=auto`` execs there until this passes), their ledgers and times.

It needs torch with CUDA, and vLLM/SGLang where they are to be measured, in the running python.
Sized for a 10-minute cap on one H200: about a minute per engine. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
QWEN25_NAME = "qwen2 (Qwen2.5-0.5B shape, random weights)"
QWEN25_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
VOCAB = 151936
# --cpu-smoke: a tiny model on the CPU, so the script's own plumbing (model, store, embedded
# engine, release/resume) is exercised where no GPU is; its figures mean nothing.
SMOKE_SHAPE = {
    **QWEN25_05B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}
SMOKE_VOCAB = 512
BATCH = 64
STORE_NAME = "policy"
PARTS = ("torch", "vllm", "sglang", "zero", "fork")


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def log(msg: str) -> None:
    print(f"[gpu_check] {msg}", file=sys.stderr, flush=True)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn: Any) -> tuple[float, Any]:
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - t0, out


def _best_rate(generate: Any, spec: dict[str, Any]) -> tuple[float, list[list[int]]]:
    """tokens/s of the best of 2 batch-64 runs after a warm-up, and the tokens."""
    generate(spec["prompts"][:8], 4)  # warm-up: kernels, graphs, allocator
    best, tokens = float("inf"), []
    for _ in range(2):
        seconds, tokens = _timed(lambda: generate(spec["prompts"], spec["new_tokens"]))
        best = min(best, seconds)
    if any(len(t) != spec["new_tokens"] for t in tokens):
        raise RuntimeError("an engine stopped before --new-tokens")
    return round(BATCH * spec["new_tokens"] / best, 1), tokens


def _store_views(spec: dict[str, Any]) -> dict[str, torch.Tensor]:
    from pivotflow.params.shm_store import ShmParamStore

    return ShmParamStore(spec["store"]).load(STORE_NAME, spec["version"])[2]


def _h2d_memcpy_s(nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8)  # pageable, as the store's pages are
    src.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=_device())
    return min(_timed(lambda: dst.copy_(src))[0] for _ in range(3))


# ---- the parts, each in its own process -------------------------------------------------------


def part_torch(spec: dict[str, Any]) -> dict[str, Any]:
    from pivotflow.engines.base import GenerationRequest, SamplingParams
    from pivotflow.engines.torch import TorchEngine, load_checkpoint

    cfg, tensors = load_checkpoint(spec["folder"])
    max_len = len(spec["prompts"][0]) + spec["new_tokens"]
    engine = TorchEngine(
        cfg, max_batch=BATCH, max_seq_len=max_len, device=_device(), dtype=torch.bfloat16
    )
    first_load_s, _ = _timed(lambda: engine.load_weights(tensors, 0))
    tensors.clear()  # the host copy is not needed any more

    def generate(prompts: list[list[int]], new: int) -> list[list[int]]:
        params = SamplingParams(temperature=0.0, max_tokens=new)
        reqs = [GenerationRequest(f"r{i}", p, params) for i, p in enumerate(prompts)]
        return [o.token_ids for o in engine.generate(reqs)]

    rate, before = _best_rate(generate, spec)

    def update() -> None:
        views = _store_views(spec)
        engine.load_weights(views, spec["version"])
        del views  # the mapping goes with the views

    update_s = min(_timed(update)[0] for _ in range(3))
    release_s, _ = _timed(engine.release_memory)
    resume_s, _ = _timed(lambda: (engine.resume_memory(), update()))
    after = generate(spec["prompts"], spec["new_tokens"])
    return {
        "tokens_per_s": rate,
        "first_load_s": round(first_load_s, 3),
        "weight_update_s": round(update_s, 3),
        "h2d_memcpy_s": round(_h2d_memcpy_s(spec["nbytes"]), 3),
        "release_s": round(release_s, 3),
        "resume_s": round(resume_s, 3),
        "resume_includes_reload": True,
        "tokens_same_after_resume": after == before,
    }


class StoreWeights:
    """vLLM worker extension (``worker_extension_cls="gpu_check.StoreWeights"``): reads a
    stored version inside vLLM's own worker, so no tensor crosses vLLM's socket."""

    def load_from_store(self, root: str, name: str, version: int) -> int:
        from pivotflow.params.shm_store import ShmParamStore

        _, _, views = ShmParamStore(root).load(name, version)
        self.model_runner.model.load_weights(weights=views.items())  # type: ignore[attr-defined]
        _sync()
        return len(views)


def part_vllm(spec: dict[str, Any]) -> dict[str, Any]:
    import vllm
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = vllm.LLM(
        model=spec["folder"],
        dtype="bfloat16",
        skip_tokenizer_init=True,
        enable_sleep_mode=True,
        gpu_memory_utilization=0.3,
        max_model_len=len(spec["prompts"][0]) + spec["new_tokens"],
        max_num_seqs=BATCH,
        seed=0,
        worker_extension_cls="gpu_check.StoreWeights",
    )
    startup_s = time.perf_counter() - t0

    def generate(prompts: list[list[int]], new: int) -> list[list[int]]:
        params = vllm.SamplingParams(
            temperature=0.0, max_tokens=new, min_tokens=new, ignore_eos=True, detokenize=False
        )
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                            use_tqdm=False)  # fmt: skip
        return [list(o.outputs[0].token_ids) for o in outs]

    rate, before = _best_rate(generate, spec)

    def update() -> None:
        llm.collective_rpc("load_from_store", args=(spec["store"], STORE_NAME, spec["version"]))
        llm.reset_prefix_cache()  # prefix caching is on: stale KV would outlive the update

    update_s = min(_timed(update)[0] for _ in range(3))
    sleep_s, _ = _timed(lambda: llm.sleep(level=1))
    wake_s, _ = _timed(llm.wake_up)
    after = generate(spec["prompts"], spec["new_tokens"])
    return {
        "version": vllm.__version__,
        "startup_s": round(startup_s, 2),
        "tokens_per_s": rate,
        "weight_update_s": round(update_s, 3),
        "sleep_s": round(sleep_s, 3),
        "wake_s": round(wake_s, 3),
        "resume_includes_reload": False,  # level 1 keeps the weights in host memory
        "tokens_same_after_resume": after == before,
    }


def part_sglang(spec: dict[str, Any]) -> dict[str, Any]:
    import sglang

    t0 = time.perf_counter()
    engine = sglang.Engine(
        model_path=spec["folder"],
        dtype="bfloat16",
        skip_tokenizer_init=True,
        enable_memory_saver=True,  # release/resume do nothing without it
        mem_fraction_static=0.3,
        context_length=len(spec["prompts"][0]) + spec["new_tokens"],
        max_running_requests=BATCH,
        random_seed=0,
        log_level="error",
    )
    startup_s = time.perf_counter() - t0

    def generate(prompts: list[list[int]], new: int) -> list[list[int]]:
        params = {"temperature": 0.0, "max_new_tokens": new, "ignore_eos": True}
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        return [list(o["output_ids"]) for o in outs]

    try:
        rate, before = _best_rate(generate, spec)

        def update() -> None:
            views = _store_views(spec)
            named = [(k, v.to("cuda", non_blocking=False)) for k, v in views.items()]
            engine.update_weights_from_tensor(named, load_format=None, flush_cache=True)
            del views, named

        update_s = min(_timed(update)[0] for _ in range(3))
        release_s, _ = _timed(engine.release_memory_occupation)
        resume_s, _ = _timed(lambda: (engine.resume_memory_occupation(), update()))
        after = generate(spec["prompts"], spec["new_tokens"])
        return {
            "version": sglang.__version__,
            "startup_s": round(startup_s, 2),
            "tokens_per_s": rate,
            "weight_update_s": round(update_s, 3),
            "release_s": round(release_s, 3),
            "resume_s": round(resume_s, 3),
            "resume_includes_reload": True,
            "tokens_same_after_resume": after == before,
        }
    finally:
        engine.shutdown()


# ---- the driver -------------------------------------------------------------------------------


def prepare(folder: Path, store_root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Write the model, publish it to the store, time that beside a host memcpy."""
    from safetensors.torch import load_file

    sys.path.insert(0, str(HERE))
    from engine import write_qwen2_folder  # the same writer as bench/engine.py's 25M model

    from pivotflow.params.shm_store import ShmParamStore

    t0 = time.perf_counter()
    shape, vocab = (SMOKE_SHAPE, SMOKE_VOCAB) if args.cpu_smoke else (QWEN25_05B, VOCAB)
    params, _ = write_qwen2_folder(folder, shape, vocab, torch.bfloat16, seed=0)
    hf_config = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    took = time.perf_counter() - t0
    log(f"{params / 1e6:.0f}M parameters, {nbytes / 2**20:.0f} MiB, written in {took:.1f} s")
    store = ShmParamStore(store_root)
    publish_s = []
    for version in (1, 2):  # the second reuses the first's pages, as steady state does
        t1 = time.perf_counter()
        store.publish(STORE_NAME, version, tensors, hf_config)
        publish_s.append(time.perf_counter() - t1)
    flat = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(flat).fill_(0)
    host_memcpy_s = []
    for _ in range(3):
        t2 = time.perf_counter()
        dst.copy_(flat)
        host_memcpy_s.append(time.perf_counter() - t2)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, vocab, (BATCH, args.prompt_len), generator=gen).tolist()
    return {
        "folder": str(folder),
        "store": str(store_root),
        "version": 2,
        "nbytes": nbytes,
        "params": params,
        "prompts": prompts,
        "new_tokens": args.new_tokens,
        "publish_s": [round(s, 3) for s in publish_s],
        "host_memcpy_s": round(min(host_memcpy_s), 3),
    }


def run_part(part: str, spec_path: Path, timeout: int) -> dict[str, Any]:
    """One engine's part in a child process; its JSON, or {"skipped"/"error": why}."""
    if part == "zero":
        return run_zero(timeout)
    if part == "fork":
        return run_fork(timeout)
    module = {"torch": "torch", "vllm": "vllm", "sglang": "sglang"}[part]
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                           text=True)  # fmt: skip
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return {"skipped": f"{module} is not importable: {last}"}
    env = dict(os.environ)
    # The child imports this file (vLLM's worker extension) and pivotflow by name.
    paths = (str(HERE), str(HERE.parent), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    log(f"{part}: starting (timeout {timeout} s)")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--part", part, "--spec", str(spec_path),
                               *(["--cpu-smoke"] if _device() == "cpu" else [])],
                              stdout=subprocess.PIPE, text=True, env=env,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"ran past --part-timeout {timeout} s"}
    lines = proc.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        out = None
    if proc.returncode != 0 or not isinstance(out, dict):
        last = lines[-1] if lines else ""
        return {"error": f"exited {proc.returncode}; last line: {last}"[:300]}
    out["part_wall_s"] = round(time.perf_counter() - t0, 1)
    log(f"{part}: {out}")
    return out


def run_zero(timeout: int) -> dict[str, Any]:
    """``bench/zero_optimizer.py`` on the GPU; its JSON, or {"error": why}."""
    smoke = _device() == "cpu"
    cmd = [sys.executable, str(HERE / "zero_optimizer.py"), "--rounds", "1", "--steps", "3",
           "--layouts", "zero0,zero1,zero1_bf16", "--device", _device(),
           "--layers", "1" if smoke else "24"]
    return run_bench("zero", cmd, timeout)


def run_bench(part: str, cmd: list[str], timeout: int) -> dict[str, Any]:
    """Another bench script as a part: its last line's JSON, or {"error": why}."""
    log(f"{part}: starting (timeout {timeout} s)")
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past --part-timeout {timeout} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"exited {proc.returncode}; last line: {lines[-1] if lines else ''}"[:300]}
    out = json.loads(lines[-1])
    log(f"{part}: {out}")
    return out


def run_fork(timeout: int) -> dict[str, Any]:
    """``bench/worker_start.py`` with runs on the GPU; its JSON, or {"error": why}."""
    cmd = [sys.executable, str(HERE / "worker_start.py"), "--repeats", "1", "--steps", "2",
           "--workers", "2", "--device", _device()]
    return run_bench("fork", cmd, timeout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--part-timeout", type=int, default=200)
    parser.add_argument("--engines", default=",".join(PARTS), help="comma list of " + str(PARTS))
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="no GPU: a tiny model, embedded engine only, on the CPU")  # fmt: skip
    parser.add_argument("--part", choices=("torch", "vllm", "sglang"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print(json.dumps({"bench": "gpu_check", "skipped": "no CUDA device"}))
        return 0
    if args.part:
        spec = json.loads(Path(args.spec).read_text())
        fn = {"torch": part_torch, "vllm": part_vllm, "sglang": part_sglang}[args.part]
        print(json.dumps(fn(spec)))
        return 0
    engines = (["torch", "zero", "fork"] if args.cpu_smoke
               else [e for e in args.engines.split(",") if e])
    if not engines or set(engines) - set(PARTS):
        parser.error(f"--engines takes a comma list of {list(PARTS)}, got {args.engines!r}")
    t0 = time.perf_counter()
    shm = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
    with (
        tempfile.TemporaryDirectory(prefix="pivotflow-gpu-") as tmp,
        tempfile.TemporaryDirectory(prefix="pivotflow-gpu-store-", dir=shm) as store,
    ):
        spec = prepare(Path(tmp) / "qwen25-05b-shape", Path(store), args)
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        results = {part: run_part(part, spec_path, args.part_timeout) for part in engines}
    print(json.dumps({
        "bench": "gpu_check",
        "device": torch.cuda.get_device_name(0) if _device() == "cuda" else "cpu (--cpu-smoke)",
        "torch_version": torch.__version__,
        "model": "qwen2 (tiny smoke shape)" if args.cpu_smoke else QWEN25_NAME,
        "dtype": "bfloat16",
        "params": spec["params"],
        "weight_bytes": spec["nbytes"],
        "batch": BATCH,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "store_publish_s": spec["publish_s"],
        "host_memcpy_s": spec["host_memcpy_s"],
        **results,
        "wall_s": round(time.perf_counter() - t0, 1),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
