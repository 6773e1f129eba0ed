"""PPO's critic in the trainer: the value model a graph's critic stage scores with, stepped
beside the policy on each batch (``Graph.critic``; verl's ``update_critic``, OpenRLHF's critic
trainer), with an AdamW of its own.

One trainer steps both models, so one optimizer step still is one version: rank 0 publishes the
critic (``<critic>``) and its optimizer state (``<critic>.optim``) with the policy's, under the
same version number, and the critic stage scores each sample with the critic of the policy that
generated it (``stages.response_score_job``). The critic trains in float32 like the policy, its
forward and backward under the policy's autocast, every weight by default; with
``critic_lora_rank`` > 0 its body is frozen and a rank-r update of each targeted layer trains
beside the value head (``lora.py``, as the policy's LoRA): it is published merged, and
``<critic>.optim`` carries the adapters beside their moments, so a trainer that takes over gets
the frozen body back.

The loss is PPO's clipped value loss (``rl.losses.value_loss``) against ``returns``, around the
values the critic stage gave (``old_values``), reduced as the policy's loss is so the data-parallel
shards' gradients sum to the batch's. Its gradient norm is clipped on its own (the policy's
``max_grad_norm``): one norm over both models would let the critic's early, large gradients
shrink the policy's step.
"""

from __future__ import annotations

import torch

from pivotflow.engines.torch.weights import build_model, config_from_hf, resolve_dtype
from pivotflow.errors import WorkerError
from pivotflow.params.base import ParamStore
from pivotflow.rl.losses import value_loss
from pivotflow.worker.group_adam import group_adam
from pivotflow.worker.lora import adapter_tensors, apply_lora, merged_state_dict
from pivotflow.worker.reward_scoring import response_values
from pivotflow.worker.train_config import TrainConfig
from pivotflow.worker.train_group import TrainGroup
from pivotflow.worker.trained_versions import publish_state, publish_version, take_over

# per-token moments of a micro-batch, summed over the step like every stat, then replaced by the
# explained variance (``explained_variance``): not records of their own
MOMENTS = ("_return_sq_mean", "_error_mean", "_error_sq_mean")


def explained_variance(stats: dict[str, float]) -> None:
    """Replace the summed moments in a step's ``stats`` by ``value_explained_var``, ``1 -
    Var(R - V) / Var(R)`` over the step's tokens (verl's ``critic/vf_explained_var``, its eps):
    1 when the critic predicts every return, 0 when it does no better than their mean, below 0
    when worse. Exact under the token-mean aggregation, where each micro-batch's stats weigh by
    its tokens; a sequence-mean weighs them by sequences instead."""
    r2, e, e2 = (stats.pop(k) for k in MOMENTS)
    r = stats["return_mean"]
    stats["value_explained_var"] = 1.0 - (e2 - e * e) / (r2 - r * r + 1e-8)


class CriticTrainer:
    """The value model and its AdamW; the train role calls it once per micro-batch and step."""

    def __init__(self, store: ParamStore, name: str, tc: TrainConfig,
                 device: torch.device, seed: int = 0) -> None:
        self.store, self.name, self.tc = store, name, tc
        _, self.hf_config, tensors = store.load(name)
        where = f"config of critic {name} (parameter store {store.root})"
        self.config = config_from_hf(self.hf_config, where)
        if self.config.num_labels != 1:
            raise WorkerError(f"{where}: a critic is a classifier with one label, got "
                              f"num_labels={self.config.num_labels}")
        master = resolve_dtype(self.hf_config, tc.train_dtype, where)
        self.model = build_model(self.config, tensors, device, master).train()
        self.model.gradient_checkpointing = tc.gradient_checkpointing
        self.model.requires_grad_(True)
        if tc.critic_lora_rank:  # (A from the run's seed, as the policy's: the same on every rank)
            apply_lora(self.model, tc.critic_lora_rank, tc.critic_lora_alpha,
                       tc.lora_target_modules, seed=seed)
            self.model.score.requires_grad_(True)  # the value head trains whole
        # (the train role zeroes, steps and regroups it beside the policy's)
        self.optim = group_adam(self.model, tc.critic_lr, tc.zero_stage)

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped value loss of one micro-batch (call under the step's autocast), with
        the moments ``explained_variance`` turns into the batch's figure once summed."""
        values = response_values(self.model, batch)
        loss, stats = value_loss(values, batch["old_values"], batch["returns"], batch["mask"],
                                 clip=self.tc.value_clip or None,
                                 aggregation=self.tc.aggregation)  # type: ignore[arg-type]
        with torch.no_grad():
            valid = batch["mask"].bool()
            ret, err = batch["returns"][valid], (batch["returns"] - values.float())[valid]
            if ret.numel():
                stats.update({MOMENTS[0]: float((ret * ret).mean()),
                              MOMENTS[1]: float(err.mean()), MOMENTS[2]: float((err * err).mean())})
            else:
                stats.update(dict.fromkeys(MOMENTS, 0.0))
        return loss, stats

    def publish_state(self, version: int, group: TrainGroup) -> list[str]:
        """This rank's part of the critic's optimizer state (and adapters) as ``version``;
        returns the names published."""
        return publish_state(self.store, self.name, version, self.optim, group,
                             adapter_tensors(self.model), self.hf_config)

    def publish_weights(self, version: int) -> list[str]:
        """The critic as ``version``, by rank 0 once every rank's part of its state is in."""
        weights = (merged_state_dict(self.model) if self.tc.critic_lora_rank
                   else self.model.state_dict())
        return publish_version(self.store, self.name, version, weights, self.hf_config)

    def weight_tensors(self) -> list[torch.Tensor]:
        """The weights ranks must agree on, in one order (AdamW's state: ``optim.regroup``)."""
        with torch.no_grad():
            return [p.data for p in self.model.parameters()]

    def load_from_store(self, version: int) -> None:
        """Take over the critic and its optimizer state at ``version``."""
        take_over(self.store, self.name, version, self.model, self.optim, "critic_lora_rank",
                  self.tc.critic_lora_rank)

    def release(self) -> None:
        del self.model, self.optim
