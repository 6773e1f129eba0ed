"""bench/cpu_costs.py's pieces: the least-squares fit, and a train measurement on the real role."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


def test_the_fit_recovers_a_decode_step_model(bench_script: Callable[[str], ModuleType]) -> None:
    bench = bench_script("cpu_costs")
    rng = random.Random(0)
    points = []
    for _ in range(200):
        b, c = rng.randint(1, 64), rng.randint(10, 5000)
        points.append((float(b), float(c), 8e-4 + 3e-5 * b + 2.5e-7 * c))
    assert bench.fit(points) == pytest.approx([8e-4, 3e-5, 2.5e-7], rel=1e-6)
    # one variable (the padded prefill): base and slope
    assert bench.fit([(x, 0.002 + 4e-5 * x) for x in (8.0, 100.0, 900.0)]) == pytest.approx(
        [0.002, 4e-5], rel=1e-6)


def test_the_train_measurement_times_both_kinds_of_step(
    tmp_path: Path, bench_script: Callable[[str], ModuleType]
) -> None:
    """The bench measures a step with signal and one without (equal rewards: no backward);
    which is cheaper is the bench's finding (bench/cpu_costs.py), not asserted here: a timed
    comparison fails whenever a neighbour loads the cores (it did, in a clean-clone CI run)."""
    from pivotflow.graph_check import load_graph
    from pivotflow.params.shm_store import ShmParamStore
    from pivotflow.run_models import prepare_models

    bench = bench_script("cpu_costs")
    graph = load_graph(bench.GRAPH)
    store = ShmParamStore(tmp_path / "store")
    tok = prepare_models(graph, store, seed=0, console=False).tokenizers["policy"]
    prompts = [tok.encode("12+34=")]
    batches = bench.train_batches(prompts, [[40] * 16, [60] * 16, [50] * 16])
    got = bench.measure_train(str(store.root), batches, {"lr": 1e-5}, 1)
    assert set(got) == {"train_per_token_s", "train_no_signal_per_token_s", "load_s"}
    assert all(math.isfinite(v) and v > 0 for v in got.values()), got


def test_a_generate_role_starts_from_the_options_the_bench_builds(
    tmp_path: Path, bench_script: Callable[[str], ModuleType]
) -> None:
    """The bench once built the roles from ``tokenizer.to_dict()``, which the BPE tokenizer
    lacks: it stopped before measuring anything. One short batch through the real role."""
    from pivotflow.graph_check import load_graph
    from pivotflow.params.shm_store import ShmParamStore
    from pivotflow.run_models import prepare_models
    from pivotflow.worker.generate_role import GenerateRole

    bench = bench_script("cpu_costs")
    store = ShmParamStore(tmp_path / "store")
    models = prepare_models(load_graph(bench.GRAPH), store, seed=0, console=False)
    for model in ("policy", "judge"):
        role = GenerateRole(store, model, bench.generate_options(models, model))
        prompts = [models.tokenizers[model].encode("12+34=")] * 3
        points, first = bench.generate_points(role, prompts, [4, 6, 8], 0)
        role.release()
        sizes = [b for b, _, _ in points]  # the batch shrinks as the 4-, 6-, 8-token ones end
        assert first > 0 and sizes[0] == 3.0 and sizes[-1] == 1.0
        assert sizes == sorted(sizes, reverse=True) and 2.0 in sizes
        assert all(c > b * 6 and s > 0 for b, c, s in points)  # (prompt + tokens so far)
