"""AdamW's state sharded over the trainers (``zero_stage`` 1, ``worker/sharded_adam.py``): the
same steps as the replicated layout, 1/world of the state on each trainer, the same published
``<model>.optim``, and the state re-cut whenever the group changes (a trainer leaves, joins, or
takes the pool over from the parameter store). Real processes, gloo on loopback."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import pytest
import torch
from spawned import run_spawned
from test_train_group import (
    OPTS,
    assert_same,
    fresh_store,
    run_trainers,
    step_msgs,
)

from pivotflow.errors import CheckpointError
from pivotflow.params.optim_entries import (
    JoinedState,
    StoredState,
    load_optim_state,
    publish_part,
)
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.worker import sharded_adam
from pivotflow.worker.adam_state import adam_tensors
from pivotflow.worker.group_adam import NO_STATE, ReplicatedAdamW, StoreCopy
from pivotflow.worker.sharded_adam import ShardedAdamW
from pivotflow.worker.train_config import check_train_options
from pivotflow.worker.train_group import TrainGroup
from pivotflow.worker.train_role import TrainRole

pytestmark = pytest.mark.timeout(180)

SHARDED = {**OPTS, "zero_stage": 1}
BUCKET = 1000  # elements: the test model's 10k weights cut into buckets that split weights


def two_models() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 3))
    b = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 3))
    b.load_state_dict(a.state_dict())
    return a, b


def test_one_sharded_trainer_steps_as_the_replicated_one_across_cut_weights() -> None:
    plain_model, cut_model = two_models()
    plain = ReplicatedAdamW(plain_model, lr=0.1)
    cut = ShardedAdamW(cut_model, lr=0.1, bucket_elems=4)  # every weight cut across buckets
    solo = TrainGroup()
    cut.regroup(solo, False, NO_STATE)
    for step in range(3):
        x = torch.randn(4, 7, generator=torch.Generator().manual_seed(step))
        norms = []
        for model, opt in ((plain_model, plain), (cut_model, cut)):
            opt.zero_grad()
            (model(x) ** 2).sum().mul(10).backward()  # large: the clip acts
            norms.append(opt.step(solo, max_grad_norm=1.0))
        assert norms[0] > 1 and norms[1] == pytest.approx(norms[0], rel=1e-6)
    for k, v in plain_model.state_dict().items():
        torch.testing.assert_close(cut_model.state_dict()[k], v, rtol=1e-6, atol=1e-7)
    state = joined(cut, solo)
    want = adam_tensors(plain_model, plain.optim)
    assert list(state) == list(want)  # the replicated layout's names, in its order
    for k, v in want.items():
        torch.testing.assert_close(state[k], v, rtol=1e-5, atol=1e-8, msg=k)
    assert float(state["0.weight.step"]) == 3.0


def test_a_state_for_another_model_is_a_one_line_error(tmp_path: Path) -> None:
    model, _ = two_models()
    store = ShmParamStore(tmp_path / "store")
    state = adam_tensors(model, ReplicatedAdamW(model, lr=0.1).optim)
    state["1.bias.exp_avg"] = torch.zeros(4)
    store.publish("policy.optim", 2, state, {})  # (a checkpoint's, as a resume publishes it)
    opt = ShardedAdamW(model, lr=0.1)
    opt.take_over(StoreCopy(store, "policy", 2))
    with pytest.raises(CheckpointError, match=r"^optimizer state entry '1\.bias\.exp_avg' is "
                                              r"missing or has shape \(4,\), not \(3,\)$"):
        opt.regroup(TrainGroup(), False, StoreCopy(store, "policy", 2))
    other = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 4))
    sharded = ShardedAdamW(other, lr=0.1)
    sharded.regroup(TrainGroup(), False, NO_STATE)
    part = sharded.state_part(TrainGroup())
    publish_part(store, "critic", 3, part.tensors, part.shard, {}, 2)
    opt.take_over(StoreCopy(store, "critic", 3))
    with pytest.raises(CheckpointError, match=r"^optimizer state critic.optim@v3 was stored for "
                                              r"other weights \(its shards' first weight "
                                              r"'0.weight'\)$"):
        opt.regroup(TrainGroup(), False, StoreCopy(store, "critic", 3))


def test_zero_stages_past_one_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"zero_stage must be 0 .* or 1 .*got 3 \(2 and 3 are "
                                         r"not built\)"):
        check_train_options({"zero_stage": 3})


def joined(opt: ShardedAdamW, solo: TrainGroup) -> dict[str, torch.Tensor]:
    """A solo trainer's shard, as the store would join it: the whole state."""
    part = opt.state_part(solo)
    assert part.shard is not None
    return dict(JoinedState(StoredState(part.shard, [part.tensors], "a solo trainer's")))


def sharded_proc(index: int, root: str, plan: list, opts: dict, wait_for: int,
                 out: mp.Queue) -> None:
    """A trainer process with small buckets, reporting the weights it ends with (its share of
    the optimizer state is checked where rank 0 published it whole); ``wait_for``: start once
    the store holds that version of the optimizer state (a trainer that comes later, to take
    the pool over)."""
    sharded_adam.BUCKET_ELEMS = BUCKET
    store = ShmParamStore(root)
    while wait_for >= 0 and wait_for not in store.versions("policy"):  # (its state is in first)
        time.sleep(0.05)
    role = TrainRole(store, "policy", opts)
    for msg in plan:
        role.train(msg)
    # (numpy has no bf16: each tensor travels as float32 with its dtype's name)
    held = {k: (str(v.dtype), v.detach().float().numpy().copy())
            for k, v in role.state_dict().items()}
    out.put((index, held, role.optim.state_bytes()))
    role.release()


def run_sharded(root: Path, plans: list[list], waits: list[int] | None = None,
                opts: dict | None = None) -> tuple[list[dict[str, torch.Tensor]], list[int]]:
    """Each trainer's weights at its end, and the bytes of AdamW's state it held."""
    waits = waits or [-1] * len(plans)
    got = run_spawned(sharded_proc, [(i, str(root), plan, opts or SHARDED, w)
                                     for i, (plan, w) in enumerate(zip(plans, waits,
                                                                       strict=True))],
                      timeout=120)
    results: list[dict[str, torch.Tensor]] = [{} for _ in plans]
    state_bytes = [0] * len(plans)
    for i, held, state_bytes[i] in got:  # (in the order they finished)
        results[i] = {k: torch.from_numpy(v).to(getattr(torch, dtype.removeprefix("torch.")))
                      for k, (dtype, v) in held.items()}
    return results, state_bytes


def weights_and_optim(solo: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    moments = {k: v for k, v in solo.items() if k.endswith((".exp_avg", ".exp_avg_sq", ".step"))}
    return {k: v for k, v in solo.items() if k not in moments}, moments


def test_the_state_is_re_cut_as_trainers_leave_join_and_take_over(tmp_path: Path) -> None:
    """A and B sharded (steps 0-1); A alone (step 2: its half comes back whole from the store);
    C, new, takes the pool over from the store (step 3); C and A again (step 4: C held it all
    and scatters A's half). Every step equals one replicated trainer's, what is published is
    the replicated layout's entry, and each trainer in a group of two holds half the moments."""
    fresh_store(tmp_path / "solo")
    solo = run_trainers(tmp_path / "solo", [[step_msgs(s, 1, 1, "")[0] for s in range(5)]])[0]
    weights, moments = weights_and_optim(solo)
    store = fresh_store(tmp_path / "pool")
    rdv1, rdv4 = str(tmp_path / "rdv1"), str(tmp_path / "rdv4")
    a_plan = [step_msgs(0, 2, 1, rdv1)[0], step_msgs(1, 2, 1, rdv1)[0],
              step_msgs(2, 1, 2, "")[0], step_msgs(4, 2, 4, rdv4)[1]]
    b_plan = [step_msgs(0, 2, 1, rdv1)[1], step_msgs(1, 2, 1, rdv1)[1]]
    c_plan = [step_msgs(3, 1, 3, "", optim_version=3)[0], step_msgs(4, 2, 4, rdv4)[0]]
    (a, b, c), state_bytes = run_sharded(store.root, [a_plan, b_plan, c_plan],
                                         waits=[-1, -1, 3])
    assert_same(a, weights)
    assert_same(c, weights)
    # the ranks' shards join into the replicated layout's <model>.optim; nobody gathered it
    assert_same(load_optim_state(store, "policy", 5), moments)
    assert not store.versions("policy.optim")
    assert [store.load(f"policy.optim.r{r}", 5)[1]["optim_shard"]["world"] for r in (0, 1)] \
        == [2, 2]
    whole = sum(t.numel() * 4 for k, t in moments.items() if not k.endswith(".step"))
    for n in state_bytes:  # each ended in a group of two: half the moments (the last bucket
        assert whole / 2 <= n <= whole / 2 + 8  # padded to an even length: a float a moment)
    assert not torch.equal(b["lm_head.weight"] if "lm_head.weight" in b else
                           b["model.embed_tokens.weight"],
                           weights.get("lm_head.weight", weights["model.embed_tokens.weight"]))


def test_a_bf16_model_keeps_float32_masters_so_small_updates_add_up() -> None:
    """With the model in bf16 (``train_dtype``) the sharded layout steps float32 master
    weights and rounds them into the model: after a few steps at a small rate the model is the
    float32 run's weights rounded, where bf16 AdamW alone rounds each update away."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(16, 8)
    with torch.no_grad():
        ref.weight.mul_(40).round_().div_(4)  # weights on bf16's grid: their spacing is coarse
        ref.bias.fill_(1.0)
    cut, plain = (torch.nn.Linear(16, 8).bfloat16() for _ in range(2))
    cut.load_state_dict(ref.state_dict())
    plain.load_state_dict(ref.state_dict())
    lr = 1e-3  # an update of about lr: under the spacing of a bf16 weight of 1 (2**-7)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    sharded = ShardedAdamW(cut, lr=lr, bucket_elems=50)  # (cuts the weight across buckets)
    alone = ReplicatedAdamW(plain, lr=lr)
    solo = TrainGroup()
    sharded.regroup(solo, False, NO_STATE)
    for step in range(5):
        g = torch.Generator().manual_seed(step)
        grads = {n: torch.randn(p.shape, generator=g).bfloat16() for n, p in ref.named_parameters()}
        for model in (ref, cut, plain):
            for n, p in model.named_parameters():
                p.grad = grads[n].to(p.dtype)
        ref_opt.step()
        sharded.step(solo, max_grad_norm=1e9)
        alone.step(solo, max_grad_norm=1e9)
    for n, p in ref.named_parameters():
        torch.testing.assert_close(dict(cut.named_parameters())[n], p.detach().bfloat16(),
                                   rtol=0, atol=0, msg=n)
        torch.testing.assert_close(joined(sharded, solo)[f"{n}.master"], p.detach(), rtol=1e-6,
                                   atol=1e-7, msg=n)
    assert torch.equal(plain.bias, torch.ones(8, dtype=torch.bfloat16))  # bf16 alone: stuck
    assert not torch.equal(cut.bias, plain.bias)  # the masters' steps added up


def test_sharded_bf16_trainers_take_one_trainers_steps_and_resume_its_masters(
        tmp_path: Path) -> None:
    """Two sharded bf16 trainers equal one; a new trainer that takes the pool over from the
    store gets the float32 masters back (``<model>.optim``'s ``.master`` entries), so its step
    equals the one the pool would have taken."""
    opts = {**SHARDED, "train_dtype": "bfloat16"}
    fresh_store(tmp_path / "solo")
    (solo,), _ = run_sharded(tmp_path / "solo", [[step_msgs(s, 1, 1, "")[0] for s in range(3)]],
                             opts=opts)
    store = fresh_store(tmp_path / "pool")
    rdv = str(tmp_path / "rdv")
    pair = [[step_msgs(s, 2, 1, rdv)[r] for s in range(2)] for r in range(2)]
    late = [step_msgs(2, 1, 2, "", optim_version=2)[0]]
    (_, _, taken), _ = run_sharded(store.root, [*pair, late], waits=[-1, -1, 2], opts=opts)
    assert {t.dtype for t in taken.values()} == {torch.bfloat16}
    published = load_optim_state(store, "policy", 3)
    assert {t.dtype for k, t in published.items() if k.endswith(".master")} == {torch.float32}
    for k, v in solo.items():  # (bf16 weights: one rounding step apart at most)
        if "k_proj.bias" not in k:
            torch.testing.assert_close(taken[k].float(), v.float(), rtol=0, atol=2e-2, msg=k)
    masters = {k.removesuffix(".master"): v for k, v in published.items()
               if k.endswith(".master")}
    for k, v in masters.items():
        assert torch.equal(v.bfloat16(), taken[k])  # the model is its masters, rounded
