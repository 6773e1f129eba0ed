"""ByteDance Seed-OSS (``seed_oss``: Seed-OSS-36B): Llama's layer with q/k/v biases and none on
o_proj, heads of 128 where the config names none (SeedOssConfig's).

Its dropout (``attention_dropout``, ``residual_dropout``: 0.1 in SeedOssConfig) is not applied
in training, as no family's is: RL's importance ratios and KL compare the trainer's logprobs
with the rollout's, which dropout would make differ by noise alone.
"""

from __future__ import annotations

from typing import Any

from pivotflow.engines.torch.hf_families import ENGINE
from pivotflow.errors import ModelConfigError


def seed_oss_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` with SeedOssConfig's default head width; raises ModelConfigError naming
    ``where`` for an o_proj bias (``attention_out_bias``), which no released model has."""
    if raw.get("attention_out_bias"):
        raise ModelConfigError(f"{where}: attention_out_bias={raw['attention_out_bias']!r} "
                               f"{ENGINE} on seed_oss (false)")
    return {**raw, "head_dim": raw.get("head_dim") or 128}
