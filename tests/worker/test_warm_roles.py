"""Warm roles (``--set warm_roles=true``): a worker keeps each role it leaves loaded and takes
it back without loading it; a trainer taken back that took the pool's last step keeps its group,
and the run trains exactly as it does with every role loaded afresh."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from pivotflow.engines.torch.weights import load_model_folder
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.protocol import AssignRole, GenerateJob, Jobs, JobsDone, RoleReady
from pivotflow.run import run
from pivotflow.worker.host import RoleHost

ROOT = Path(__file__).resolve().parents[2]


def store_with_policy(tmp_path: Path, folder: Path) -> ShmParamStore:
    model = load_model_folder(folder)
    store = ShmParamStore(tmp_path / "store")
    store.publish("policy", 0, model.tensors, model.hf_config)
    return store


def ready(host: RoleHost, role: str, keep: bool) -> RoleReady:
    [msg] = host.handle(AssignRole(role=role, model="policy",
                                   options={"engine": "torch", "max_batch": 4}, keep=keep))
    assert isinstance(msg, RoleReady)
    return msg


def test_a_role_left_stays_loaded_and_comes_back_without_a_load(
    tmp_path: Path, random_models: dict[str, Path]
) -> None:
    store = store_with_policy(tmp_path, random_models["policy"])
    host = RoleHost("w0", store)
    first = ready(host, "generate", keep=True)
    engine = host.role
    assert not first.resumed and first.load_s > 0
    trainer = ready(host, "train", keep=True)
    assert not trainer.resumed and set(host.parked) == {("generate", "policy")}
    # the trainer publishes v1 meanwhile (as the pool's step would)
    model = load_model_folder(random_models["policy"])
    store.publish("policy", 1, model.tensors, model.hf_config)
    back = ready(host, "generate", keep=True)
    assert back.resumed and back.load_s == 0.0 and back.version == 0
    assert host.role is engine and set(host.parked) == {("train", "policy")}
    # a job asking for the newer weights makes the resumed engine take them
    job = GenerateJob(job_id=1, prompt_ids=[5, 6, 7], max_tokens=3, min_version=1)
    assert host.handle(Jobs(jobs=[job])) == []
    done = []
    while host.has_work():
        done += [r for m in host.step() if isinstance(m, JobsDone) for r in m.results]
    assert [r.job_id for r in done] == [1] and min(done[0].versions) >= 1
    # without keep, the role held and every parked one are let go
    assert not ready(host, "train", keep=False).resumed
    assert host.parked == {}
    host.release()


@pytest.mark.timeout(240)
def test_a_run_with_warm_roles_trains_step_for_step_as_one_without(tmp_path: Path) -> None:
    # 2 workers for 3 pools: on the long-tail graph backpressure moves both workers between
    # the pools every step, and trains on both
    graph = ROOT / "graphs" / "grpo_genrm_longtail.py"
    recs, shifts = {}, {}
    for warm in (False, True):
        out = tmp_path / f"warm-{warm}"
        run(graph, sets=["live=false", "planner=backpressure", "seed=0",
                         f"warm_roles={str(warm).lower()}"],
            out=out, workers=2, steps=8, console=False)
        recs[warm] = [json.loads(line) for line in (out / "metrics.jsonl").open()]
        shifts[warm] = [json.loads(line) for line in (out / "shifts.jsonl").open()]
    for off, on in zip(recs[False], recs[True], strict=True):
        assert on["task_accuracy"] == off["task_accuracy"]
        assert on["train_loss"] == pytest.approx(off["train_loss"], rel=1e-4)
    assert not any(s["resumed"] for s in shifts[False])
    resumed = [s for s in shifts[True] if s["resumed"]]
    assert resumed and all(s["load_s"] == 0.0 for s in resumed)
    # two workers: a step on 2 trainers after one on 2 has the same members; cold, they left
    # and came back with new roles (a new group), warm, they took their trainers back
    for warm in (False, True):
        again = [r for prev, r in itertools.pairwise(recs[warm])
                 if prev["train_world"] == r["train_world"] == 2]
        assert all(r["train_group_formed"] == (0 if warm else 1) for r in again)


def test_a_trainer_taken_back_is_the_member_it_was() -> None:
    """What the controller's trainer group rests on: a worker that left the trainer pool and
    took its trainer back (resumed) counts as the same member; one that loaded it afresh does
    not (TrainSteps re-forms the group then)."""
    from pivotflow.controller.pools import Pool, Roster

    pools = {name: Pool(name, role, "policy") for name, role in
             (("rollout", "generate"), ("trainer", "train"))}
    roster = Roster(pools, {"w0": "trainer", "w1": "trainer"})
    for w in roster.workers.values():
        w.assigned("train", "policy", 1)
        w.ready(0)
    member = {w: h.roles_taken for w, h in roster.workers.items()}
    for w in ("w0", "w1"):
        roster.move(w, "rollout")
        roster.workers[w].ready(1)  # an engine loaded afresh (its first)
        roster.move(w, "trainer")
    roster.workers["w0"].ready(1, resumed=True)
    roster.workers["w1"].ready(1, resumed=False)
    assert roster.workers["w0"].roles_taken == member["w0"]
    assert roster.workers["w1"].roles_taken != member["w1"]
