"""Cost models: how long each piece of GPU work takes on a simulated worker.

Roofline terms from the workload's hardware figures, each replaceable by a measured coefficient
(``[policy.measured]``, ``[judge.measured]``): that is the calibration hook.

* Decode step of a replica with ``b`` sequences and ``c`` context tokens in all:
  ``overhead + weights_read(b) / BW + 2 * active * b / FLOPS + kv_bytes * c / BW``
  (memory-bound weights, compute-bound matmuls, memory-bound KV reads). For a mixture of
  experts, ``weights_read`` counts only the experts the batch routes to.
* Prefill of ``p`` tokens: ``(2 * active * p + 2 * layers * hidden * p^2) / FLOPS`` (matmuls
  plus causal attention). A migrated sequence re-prefills its prompt and prefix.
* Train: ``(6 * active + 6 * layers * hidden * len) * tokens / (gpus * FLOPS * mfu)``.
* Shift: release the old role, move the new role's bytes per GPU from the parameter store at
  ``load_gb_s``, start the engine.

``BW`` and ``FLOPS`` are per replica: ``tp`` GPUs times peak times efficiency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pivotflow.batching import prefill_shapes
from pivotflow.sim.workload import Lengths, ModelSpec, Workload


@dataclass(frozen=True, slots=True)
class DecodeCoeffs:
    """A replica's decode step ``base + per_seq * b + per_ctx * c`` (seconds)."""

    base: float
    per_seq: float
    per_ctx: float

    def step_s(self, b: float, c: float) -> float:
        return self.base + self.per_seq * b + self.per_ctx * c


class CostModel:
    """Costs of one workload's models on its hardware (all times in seconds)."""

    def __init__(self, wl: Workload) -> None:
        self.wl = wl
        hw = wl.hardware
        self.hw = hw
        self._flops = hw.tflops * 1e12
        self._bw = hw.hbm_tb_s * 1e12 * hw.hbm_eff
        self._response: dict[int, Lengths] = {}  # policy version -> its lengths (drift)
        # The run's policy version now (the simulated cluster sets it after each optimizer
        # step): a judge job carries no policy version (its weights are the judge's), so its
        # verdict length follows the schedule at the version the run is at
        self.policy_version = 0

    def response_at(self, step: int) -> Lengths:
        """The response lengths of policy version ``step`` (cached: asked once per job)."""
        got = self._response.get(step)
        if got is None:
            got = self._response[step] = self.wl.response_at(step)
        return got

    def verdict_at(self, step: int) -> int:
        return self.wl.verdict_tokens if self.wl.schedule is None else self.wl.verdict_at(step)

    def model(self, name: str) -> ModelSpec:
        """The workload's model called ``name`` ("policy" or "judge")."""
        return self.wl.policy if name == "policy" else self.wl.judge

    def replicas(self, m: ModelSpec, gpus: int) -> int:
        """Replicas of ``m`` a worker of ``gpus`` GPUs runs (data parallel inside the group)."""
        return max(1, gpus // m.tp)

    def weights_read_bytes(self, m: ModelSpec, b: float) -> float:
        """Bytes of weights one decode step reads at batch ``b`` (MoE: the routed experts)."""
        if not m.moe:
            return m.weight_bytes
        dense = (m.params_b - m.expert_params_b) * 1e9 * 2
        touched = 1.0 - (1.0 - m.experts_active / m.experts) ** max(b, 1.0)
        return dense + m.expert_params_b * 1e9 * 2 * touched

    def decode(self, m: ModelSpec, b: float) -> DecodeCoeffs:
        """Per-replica step coefficients at batch ``b`` (per_seq folded into base for MoE)."""
        meas = m.measured
        flops, bw = self._flops * m.tp, self._bw * m.tp
        base = meas.get(
            "decode_base_s", self.hw.step_overhead_ms * 1e-3 + self.weights_read_bytes(m, b) / bw
        )
        per_seq = meas.get(
            "decode_per_seq_s", 2 * m.active_params_b * 1e9 / (flops * self.hw.decode_mfu)
        )
        per_ctx = meas.get("decode_per_ctx_token_s", m.kv_bytes_per_token / bw)
        return DecodeCoeffs(base, per_seq, per_ctx)

    def prefill_s(self, m: ModelSpec, tokens: int) -> float:
        """One replica prefilling ``tokens`` tokens of one sequence."""
        if "prefill_per_token_s" in m.measured:
            return m.measured["prefill_per_token_s"] * tokens
        work = 2 * m.active_params_b * 1e9 * tokens + 2 * m.layers * m.hidden * tokens**2
        return work / (self._flops * m.tp * self.hw.prefill_mfu)

    def prefill_batch_s(self, m: ModelSpec, lengths: list[int]) -> float:
        """One replica prefilling sequences of ``lengths`` tokens that arrive together: where
        measured so (the embedded engine), in the engine's passes (``batching.prefill_shapes``;
        one pass where the sitting's engine made one), each padded to its longest; else each on
        its own."""
        meas = m.measured
        if "prefill_per_padded_token_s" in meas:
            passes = ([(len(lengths), max(lengths))]  # the engine before 2026-12-05
                      if meas.get("prefill_one_pass") else prefill_shapes(lengths))
            return (meas.get("prefill_base_s", 0.0) * len(passes)
                    + meas["prefill_per_padded_token_s"] * sum(n * w for n, w in passes))
        return sum(self.prefill_s(m, n) for n in lengths)

    def train_s(self, tokens: int, seqs: int, gpus: int, signal: bool = True) -> float:
        """An optimizer step's compute over ``tokens`` tokens in ``seqs`` sequences on ``gpus``;
        a step without ``signal`` (every advantage 0) runs the forward only, where measured."""
        m = self.wl.policy
        meas = m.measured
        if not signal and "train_no_signal_per_token_s" in meas:
            return meas["train_no_signal_per_token_s"] * tokens / gpus
        if "train_per_token_s" in meas:
            return meas["train_per_token_s"] * tokens / gpus
        mean_len = tokens / max(seqs, 1)
        per_token = 6 * m.active_params_b * 1e9 + 6 * m.layers * m.hidden * mean_len
        return per_token * tokens / (gpus * self._flops * self.hw.train_mfu)

    def train_world_s(
        self, batch_tokens: int, world: int, signal: bool, new_group: bool
    ) -> float | None:
        """A data-parallel step of ``world`` trainers over ``batch_tokens`` where measured so
        (its ranks' sharing of the cores is in the figure), else None; ``new_group``: the
        pool's members changed, so the group forms again first."""
        meas = self.wl.policy.measured
        kind = "" if signal else "_no_signal"
        per_token = meas.get(f"train{kind}_per_token_s_world{world}")
        if per_token is None:
            return None
        regroup = meas.get(f"train_regroup_s_world{world}", 0.0) if new_group else 0.0
        return per_token * batch_tokens + regroup

    def role_bytes_per_gpu(self, role: str, m: ModelSpec) -> float:
        """Bytes one GPU pulls from the parameter store to host ``role`` for ``m``."""
        if role == "train":  # weights + optimizer state, sharded over the trainer's FSDP group
            per_param = 2 + self.wl.optimizer_bytes_per_param
            return m.params_b * 1e9 * per_param / self.wl.train_shard_gpus
        return m.weight_bytes / m.tp

    def load_s(self, role: str, m: ModelSpec) -> float:
        """Taking up ``role``: move its bytes per GPU, then start the engine."""
        if "load_s" in m.measured:
            return m.measured["load_s"]
        return self.role_bytes_per_gpu(role, m) / (self.hw.load_gb_s * 1e9) + self.hw.engine_start_s

    def warmup_s(self, m: ModelSpec) -> float:
        """Of ``load_s``, the engine's start (none where a measured load stands for both)."""
        return 0.0 if "load_s" in m.measured else self.hw.engine_start_s

    def weight_sync_s(self, m: ModelSpec) -> float:
        """A generate worker pulling a new policy version (weights only, no engine restart)."""
        return m.weight_bytes / m.tp / (self.hw.load_gb_s * 1e9)

    def max_seqs(self, m: ModelSpec, ctx_tokens: float) -> int:
        """Sequences one replica holds: KV memory left after weights over ``ctx_tokens`` each,
        at most the engine's ``max_seqs``."""
        free = m.tp * self.hw.hbm_gb * 1e9 * self.hw.mem_util - m.weight_bytes
        fit = int(free / (m.kv_bytes_per_token * max(ctx_tokens, 1.0)))
        return max(1, min(self.hw.max_seqs, fit))

    # ------------------------------------------------------------ lengths

    def mean_length(self, median: int, sigma: float, cap: int) -> float:
        """Mean of ``min(cap, median * exp(sigma Z))`` (closed form of the capped log-normal)."""
        if sigma == 0:  # p99_over_median = 1: every length is the median
            return float(min(median, cap))
        mu = math.log(median)
        lc = math.log(cap)
        phi = _norm_cdf
        below = math.exp(mu + sigma**2 / 2) * phi((lc - mu - sigma**2) / sigma)
        return below + cap * (1 - phi((lc - mu) / sigma))

    def mean_response(self) -> float:
        r = self.wl.response
        return self.mean_length(r.median, r.sigma, r.cap)

    def mean_prompt(self) -> float:
        p = self.wl.prompt
        return self.mean_length(p.median, p.sigma, p.cap)

    def judge_prompt_tokens(self, prompt: float, response: float) -> float:
        """What the judge reads: template + BOS + prompt + response."""
        return self.wl.template_tokens + 1 + prompt + response


def _norm_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))
