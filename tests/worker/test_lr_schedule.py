"""The learning rate over optimizer steps (``train_config.lr_at``): its shapes at known points,
its bad settings, and a real trainer stepping at it (the run filling in a decay's end:
tests/test_config.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_train_group import fresh_store, step_msgs

from pivotflow.worker.train_config import TrainConfig, check_train_options, lr_at


def test_warm_up_then_constant() -> None:
    tc = TrainConfig(lr=1e-3, lr_warmup_steps=4)
    assert [lr_at(tc, k) for k in range(6)] == pytest.approx(
        [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])  # (the first step is not a step of 0)


def test_cosine_and_linear_decay_to_the_floor_and_stay() -> None:
    cos = TrainConfig(lr=1.0, lr_schedule="cosine", lr_warmup_steps=2, lr_decay_steps=12,
                      min_lr_ratio=0.1)
    assert lr_at(cos, 0) == pytest.approx(0.5)
    assert lr_at(cos, 2) == pytest.approx(1.0)  # the decay starts at the top
    assert lr_at(cos, 7) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway: cos(pi/2) = 0
    assert lr_at(cos, 12) == pytest.approx(0.1) and lr_at(cos, 40) == pytest.approx(0.1)
    lin = TrainConfig(lr=1.0, lr_schedule="linear", lr_decay_steps=10)
    assert [lr_at(lin, k) for k in (0, 5, 10, 11)] == pytest.approx([1.0, 0.5, 0.0, 0.0])
    assert all(lr_at(cos, k) >= lr_at(cos, k + 1) for k in range(2, 20))
    assert lr_at(cos, 3) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 10)))


@pytest.mark.parametrize(("options", "match"), [
    ({"lr_schedule": "step"}, r"lr_schedule must be one of \['constant', 'cosine', 'linear'\]"),
    ({"lr_warmup_steps": -1}, "lr_warmup_steps and lr_decay_steps must be >= 0"),
    ({"lr_warmup_steps": 10, "lr_decay_steps": 10}, r"lr_decay_steps \(10\) must be more than"),
    ({"min_lr_ratio": 1.5}, r"min_lr_ratio must be in \[0, 1\], got 1.5"),
    ({"lr_warmup": 10}, "unknown setting 'lr_warmup'; valid: lr, lr_schedule"),
])
def test_a_bad_schedule_names_the_knob(options: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_train_options(options)


def test_a_trainer_steps_at_the_scheduled_rate(tmp_path: Path) -> None:
    """AdamW's first update of a weight is ``lr * g / (|g| + eps)``: about lr wherever the
    gradient is not tiny. Under a 4-step warm-up the first step (step 0) moves the weights by
    a quarter of lr, and a trainer taking over at step 3 steps at lr whole (the rate is a
    function of the step, so it needs no state from the trainer before it)."""
    from pivotflow.worker.train_role import TrainRole

    moved = {}
    for step in (0, 3):
        role = TrainRole(fresh_store(tmp_path / f"s{step}"), "policy",
                         {"lr": 1e-2, "lr_warmup_steps": 4})
        before = {k: v.clone() for k, v in role.state_dict().items()}
        msg = step_msgs(0, 1, 1, "")[0]
        msg.step = step
        done = role.train(msg)
        assert done.stats["lr"] == pytest.approx(1e-2 * (step + 1) / 4)
        moved[step] = max(float((role.state_dict()[k] - before[k]).abs().max()) for k in before)
    assert moved[0] == pytest.approx(2.5e-3, rel=0.01)
    assert moved[3] == pytest.approx(1e-2, rel=0.01)
    with pytest.raises(ValueError, match="lr_schedule 'cosine' needs lr_decay_steps"):
        TrainRole(fresh_store(tmp_path / "bad"), "policy",
                  {"lr_schedule": "cosine", "lr_warmup_steps": 3})
