"""The train role: GRPO-style policy-gradient steps that publish each new policy version.

Several trainers form a data-parallel group (``train_group.py``): each takes a shard, scales
its loss by the whole batch's totals, and the summed gradients are the batch's gradient, so one
step is the same with one trainer or four. Rank 0 publishes the AdamW state with every version
(``<model>.optim``), so a trainer that leaves, or dies, never takes it along: the next rank 0
that did not take the last step picks it up from the store.

Precision: the weights and AdamW state are kept in float32 (``train_dtype``, default float32)
whatever the model's own dtype, because a bf16 weight rounds away every update smaller than
1/256 of itself, so small learning-rate steps would vanish; the store then holds float32
versions and each engine casts them to the dtype it serves in. When the run's ``dtype`` is
bfloat16 (given, or "auto" on a bf16 model) the forward and backward run under bf16 autocast
over those float32 weights. float16 compute is not used: its gradients underflow without loss
scaling. ``device`` (default cpu) is where the model and its optimizer state live. With
``train_dtype`` bfloat16 the model itself is bf16: under ``zero_stage`` 1 each trainer keeps
float32 master weights and moments of its chunk beside it (``sharded_adam.py``: half the
weights' and gradients' memory, no update lost), under 0 everything is bf16.

LoRA (``lora_rank`` > 0, ``lora.py``): the weights stay frozen, the adapters train, every version
publishes the merged policy and ``<model>.optim`` carries the adapters beside AdamW's state.

A critic (``critic_model``, PPO's value model: ``critic_trainer.py``) is stepped beside the
policy on the same micro-batches and published with it under the same version.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import torch

from pivotflow.controller.train_tokens import valid_tokens
from pivotflow.engines.torch.feedforward import LoadBalance, routing_from_bytes
from pivotflow.engines.torch.model import ModelConfig
from pivotflow.engines.torch.weights import build_model, config_from_hf, resolve_dtype
from pivotflow.params.base import ParamStore
from pivotflow.params.node_agent import wait_crossed
from pivotflow.protocol import TrainDone, TrainSeq, TrainStep
from pivotflow.rl import policy_loss
from pivotflow.worker.critic_trainer import CriticTrainer, explained_variance
from pivotflow.worker.group_adam import StoreCopy, group_adam
from pivotflow.worker.lora import (
    adapter_tensors,
    adapters_off,
    apply_lora,
    merged_state_dict,
)
from pivotflow.worker.response_scoring import response_logprobs, response_logprobs_entropy
from pivotflow.worker.train_config import lr_at, train_config
from pivotflow.worker.train_group import TrainGroup
from pivotflow.worker.trained_versions import publish_state, publish_version, take_over
from pivotflow.worker.worker_config import worker_config


def pad_sequences(seqs: list[list[int]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded ids ``[B, T]`` and their attention mask (1 = a real token): a ``pack``ed
    batch's, and a reward model's whole sequences (``reward_scoring.sequence_scores``)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        attn[i, : len(s)] = 1
    return {"ids": ids, "attn": attn}


def pack_routing(batch: dict[str, torch.Tensor], seqs: list[TrainSeq],
                 cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Add ``routing`` [B, width, sparse layers, k] to a ``pack``ed batch when its sequences
    carry their rollout's expert choices (routing replay): -1 where one carries none, and at
    its last position (never fed to the rollout), where the trainer's router chooses."""
    if not cfg.sparse_layers or not any(s.routing for s in seqs):
        return batch
    b, width = batch["ids"].shape
    out = torch.full((b, width, cfg.sparse_layers, cfg.num_experts_per_tok), -1,
                     dtype=torch.int16)  # fmt: skip
    for i, s in enumerate(seqs):
        if s.routing:
            recorded = routing_from_bytes(s.routing, cfg)[:width]
            out[i, : recorded.shape[0]] = recorded.to(torch.int16)
    batch["routing"] = out
    return batch


def pack(seqs: list[TrainSeq], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded prompt+response ids, with response-token positions and their old logprobs
    (and the reference model's, ``ref``, when every sequence carries them).

    Position ``p`` of ``logits`` predicts token ``p + 1``, so the response token at index ``j``
    (absolute position ``len(prompt) + j``) is scored by logits at ``len(prompt) + j - 1``.
    """
    out = pad_sequences([s.prompt_ids + s.response_ids for s in seqs], pad_id)
    resp = max(max(len(s.response_ids) for s in seqs), 1)
    b = len(seqs)
    gather = torch.zeros(b, resp, dtype=torch.long)  # logit position of each response token
    targets = torch.zeros(b, resp, dtype=torch.long)
    old = torch.zeros(b, resp)
    ref = torch.zeros(b, resp) if all(s.ref_logprobs for s in seqs) else None
    mask = torch.zeros(b, resp)
    valid = torch.zeros(b, resp, dtype=torch.bool)  # a response token, not padding
    versions = torch.full((b, resp), -1, dtype=torch.long)  # the policy version that sampled it
    for i, s in enumerate(seqs):
        p, r = len(s.prompt_ids), len(s.response_ids)
        gather[i, :r] = torch.arange(p - 1, p + r - 1)
        targets[i, :r] = torch.tensor(s.response_ids, dtype=torch.long)
        valid[i, :r] = True
        old[i, :r] = torch.tensor(s.logprobs)
        if len(s.versions) == r:  # (a scoring role's sequences carry none)
            versions[i, :r] = torch.tensor(s.versions, dtype=torch.long)
        if ref is not None:
            ref[i, :r] = torch.tensor(s.ref_logprobs)
        lm = s.loss_mask if s.loss_mask else [1] * r
        mask[i, :r] = torch.tensor(lm, dtype=torch.float32)
    out.update(gather=gather, targets=targets, old=old, mask=mask, valid=valid,
               versions=versions, adv=_advantages(seqs, resp))
    if ref is not None:
        out["ref"] = ref
    # a critic's targets, and the values they came with (an empty response has none)
    if any(s.returns for s in seqs):
        out["old_values"] = _padded([s.values for s in seqs], resp)
        out["returns"] = _padded([s.returns for s in seqs], resp)
    return out


def _padded(rows: list[Sequence[float] | torch.Tensor], width: int) -> torch.Tensor:
    """Per-response-token rows, one per sequence, right-padded with 0 to ``width``."""
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.float32)
    return out


def _advantages(seqs: list[TrainSeq], width: int) -> torch.Tensor:
    """``[B]`` one advantage a sequence, or ``[B, T]`` when some carry one a token (GAE's): a
    sequence without then carries its own on every token."""
    if not any(s.token_advantages for s in seqs):
        return torch.tensor([s.advantage for s in seqs], dtype=torch.float32)
    return _padded([s.token_advantages or [s.advantage] * len(s.response_ids) for s in seqs],
                   width)


def micro_batches(seqs: list[TrainSeq], budget: int) -> list[list[TrainSeq]]:
    """``seqs`` sorted by length and cut so each part pads to at most ``budget`` token
    positions: with long-tailed lengths, padding everything to the longest would multiply the
    work (verl's dynamic batch size and slime's packing avoid the same waste)."""
    parts: list[list[TrainSeq]] = []
    width = 0
    for s in sorted(seqs, key=lambda s: len(s.prompt_ids) + len(s.response_ids)):
        n = len(s.prompt_ids) + len(s.response_ids)
        if parts and (len(parts[-1]) + 1) * max(width, n) <= budget:
            parts[-1].append(s)
        else:
            parts.append([s])
        width = n
    return parts


def mini_batch_parts(msg: TrainStep) -> list[tuple[list[TrainSeq], int, int]]:
    """This rank's sequences of each mini-batch of the step, with the whole mini-batch's valid
    tokens and sequences (what its loss is scaled by): the controller's ``part_sizes`` and
    totals, or the whole shard as one."""
    if not msg.part_sizes:
        tokens = msg.total_tokens or sum(valid_tokens(s) for s in msg.seqs)
        nseqs = msg.total_seqs or sum(1 for s in msg.seqs if valid_tokens(s) > 0)
        return [(msg.seqs, tokens, nseqs)]
    out, at = [], 0
    for size, tokens, nseqs in zip(msg.part_sizes, msg.part_tokens, msg.part_seqs,
                                   strict=True):
        out.append((msg.seqs[at: at + size], tokens, nseqs))
        at += size
    return out


def batch_weight(aggregation: str, mask: torch.Tensor, total_tokens: int,
                 total_seqs: int) -> float:
    """This micro-batch's share of the step's loss: its valid tokens (token-mean) or valid
    sequences (the sequence means) over the whole batch's, so the summed gradient is the
    batch's gradient however it is cut into shards and micro-batches."""
    if aggregation == "token-mean":
        local, total = float(mask.sum()), total_tokens
    else:
        local, total = float((mask.sum(1) > 0).sum()), total_seqs
    return local / total if total > 0 else 0.0


class TrainRole:
    """Holds the policy and its AdamW state; one ``train`` call is one optimizer step."""

    def __init__(self, store: ParamStore, model: str, options: dict) -> None:
        self.store, self.model_name = store, model
        t0 = time.perf_counter()
        # The HF dict is kept as it came: every version this trainer publishes carries it.
        self.version, self.hf_config, tensors = store.load(model)
        where = f"config of {model}@v{self.version} (parameter store {store.root})"
        self.config = config_from_hf(self.hf_config, where)
        wc = worker_config(options)
        self.device = torch.device(wc.device)
        self.tc = train_config(options)  # the knobs, typed (graph.train checked them)
        # (a decaying schedule without its end is an error here, not at its first decayed step)
        lr_at(self.tc, max(self.tc.lr_warmup_steps, self.tc.lr_decay_steps))
        master = resolve_dtype(self.hf_config, self.tc.train_dtype, where)
        compute = resolve_dtype(self.hf_config, wc.dtype, where)
        bf16_compute = compute == torch.bfloat16 and master != torch.bfloat16
        self.autocast = torch.bfloat16 if bf16_compute else None
        self.model = build_model(self.config, tensors, self.device, master).train()
        self.model.gradient_checkpointing = self.tc.gradient_checkpointing
        self.model.requires_grad_(True)
        if self.tc.lora_rank:  # (the same A on every trainer of a run: the run's seed)
            apply_lora(self.model, self.tc.lora_rank, self.tc.lora_alpha,
                       self.tc.lora_target_modules, seed=wc.seed)
        t_optim = time.perf_counter()
        self.optim = group_adam(self.model, self.tc.lr, self.tc.zero_stage)
        self.critic = (CriticTrainer(store, self.tc.critic_model, self.tc, self.device,
                                     seed=wc.seed) if self.tc.critic_model else None)
        self.group = TrainGroup()
        self.warmup_s = time.perf_counter() - t_optim
        self.load_s = time.perf_counter() - t0

    def train(self, msg: TrainStep) -> TrainDone:
        t0 = time.perf_counter()
        if msg.rank == 0 and msg.optim_version >= 0:
            self.load_from_store(msg.optim_version)
        formed = self.group.join(msg.epoch, msg.rank, msg.world, msg.rendezvous)
        if formed:
            self.group.broadcast(self.weight_tensors())
        self.optim.regroup(self.group, formed, StoreCopy(self.store, self.model_name,
                                                         self.version))
        if self.critic is not None:
            self.critic.optim.regroup(self.group, formed, StoreCopy(
                self.store, self.tc.critic_model, self.version))
        sync_s = time.perf_counter() - t0
        lr = lr_at(self.tc, msg.step)
        self.optim.set_lr(lr)
        # (no signal: Adam would still move every weight along its stale momentum; and under
        # a critic's warm-up the policy waits for it)
        policy_steps = msg.any_signal and (self.critic is None
                                           or msg.step >= self.tc.critic_warmup)
        parts = mini_batch_parts(msg)
        updates = len(parts) * self.tc.epochs
        # several updates a step: the proximal policy of the decoupled loss is the step's
        # first weights, scored once before any update (AReaL's recomputed proximal logprobs)
        prox = (self._proximal(msg.seqs) if self.tc.decoupled_loss and updates > 1 else None)
        sums: dict[str, float] = {}
        norms: list[tuple[float, float | None]] = []
        for epoch in range(self.tc.epochs):
            for i, (seqs, tokens, nseqs) in enumerate(parts):
                # (the weights are still the step's first only in the first update)
                norms.append(self._update(seqs, tokens, nseqs, policy_steps, prox, sums,
                                          1.0 / updates, first=epoch == 0 and i == 0))
        grad_norm = sum(n for n, _ in norms) / len(norms)
        critic_norm = (None if self.critic is None
                       else sum(c or 0.0 for _, c in norms) / len(norms))
        summed = torch.tensor(list(sums.values()), dtype=torch.float64)
        self.group.all_reduce_sum([summed])
        out = dict(zip(sums, summed.tolist(), strict=True))
        gap, on_policy = out.pop("rollout_gap_abs"), out.pop("rollout_gap_tokens")
        if on_policy:  # (a step whose tokens all came from older weights has no gap to show)
            out["rollout_logprob_gap"] = gap / on_policy
        # the step's valid tokens, every rank's and mini-batch's (``train_tokens``): averaged
        # as above, the loss's count would be a token-weighted mean of micro-batch sizes
        out["tokens"] = float(sum(tokens for _, tokens, _ in parts))
        if critic_norm is not None:
            out["critic_grad_norm"] = critic_norm
            explained_variance(out)
        self.version = msg.step + 1
        # the optimizer state too, every rank its part: a trainer may die, or leave, any time
        entries = self.publish_state()
        if self.critic is not None:
            entries += self.critic.publish_state(self.version, self.group)
        # on a cluster: report the step once its version is on every node (see node_agent)
        for entry in entries:
            wait_crossed(self.store.root, entry, self.version)
        # every rank's part is in the store before the weights are: a version whose weights
        # are there has its state whole (a rank that dies before this fails the step)
        self.group.all_reduce_sum([torch.zeros(1)])
        if msg.rank == 0:
            published = publish_version(self.store, self.model_name, self.version,
                                        self.state_dict(), self.hf_config)
            if self.critic is not None:
                published += self.critic.publish_weights(self.version)
            for entry in published:
                wait_crossed(self.store.root, entry, self.version)
        out.update({"lr": lr, "grad_norm": grad_norm, "step_s": time.perf_counter() - t0,
                    "sync_s": sync_s, "world": float(msg.world),
                    "group_formed": float(formed)})
        return TrainDone(step=msg.step, version=self.version, stats=out,
                         job_ids=[s.job_id for s in msg.seqs], rank=msg.rank)

    def _update(self, seqs: list[TrainSeq], total_tokens: int, total_seqs: int,
                policy_steps: bool, prox: dict[int, torch.Tensor] | None,
                sums: dict[str, float], share: float,
                first: bool = False) -> tuple[float, float | None]:
        """One optimizer update of the policy (and the critic) on this rank's ``seqs`` of one
        mini-batch, whose whole-batch totals scale the loss; adds each stat, weighted by its
        micro-batch's part of the mini-batch and by ``share`` (the update's part of the step),
        to ``sums``. Returns the gradient norms before clipping (policy, critic)."""
        aggregation = self.tc.aggregation
        self.optim.zero_grad()
        if self.critic is not None:
            self.critic.optim.zero_grad()
        for part in micro_batches(seqs, self.tc.micro_batch_tokens):
            packed = pack_routing(pack(part), part, self.model.config)
            batch = {k: v.to(self.device) for k, v in packed.items()}
            if self.base_is_reference and "ref" not in batch:
                batch["ref"] = self._base_logprobs(batch)
            cfg = self.model.config  # (a mixture of experts: its balance, reported or trained)
            balance = LoadBalance(cfg.num_experts, batch["attn"]) if cfg.sparse_layers else None
            with self._compute():
                logp, entropy = response_logprobs_entropy(
                    self.model, batch, "grad" if self.tc.entropy_coef > 0 else "report",
                    self.tc.logits_chunk_tokens, balance)
            # decoupled: the proximal policy is the step's first weights: this forward's on a
            # step of one update, else scored before the first (see TrainConfig.decoupled_loss)
            behavior = batch["old"] if self.tc.decoupled_loss else None
            proximal = (batch["old"] if not self.tc.decoupled_loss
                        else logp.detach() if prox is None
                        else _padded([prox[s.job_id] for s in part],
                                     logp.shape[1]).to(self.device))
            loss, stats = policy_loss(
                logp, proximal, batch["adv"], batch["mask"],
                clip_eps=self.tc.clip_eps, clip_eps_high=self.tc.clip_eps_high,
                dual_clip=self.tc.dual_clip, behavior_logprobs=behavior, behavior_weight_cap=self.tc.behavior_weight_cap,
                aggregation=aggregation,  # type: ignore[arg-type]
                # GRPO's beta against the reference role's logprobs (0 still reports kl_ref
                # when the samples carry them)
                ref_logprobs=batch.get("ref"), kl_coef=self.tc.kl_coef,
                kl_estimator=self.tc.kl_estimator,  # type: ignore[arg-type]
                entropy=entropy, entropy_coef=self.tc.entropy_coef,
                importance_sampling_level=self.tc.importance_sampling_level,  # type: ignore[arg-type]
                top_entropy_quantile=self.tc.top_entropy_quantile,
            )
            if balance is not None:  # ("loss" is then the surrogate plus the coefficient's part)
                aux = balance.loss()
                stats["router_aux_loss"] = float(aux.detach())
                if self.tc.router_aux_loss_coef:
                    loss = loss + self.tc.router_aux_loss_coef * aux
            weight = batch_weight(aggregation, batch["mask"], total_tokens, total_seqs)
            if policy_steps:
                (loss * weight).backward()
            if self.critic is not None:  # (every batch teaches the critic, signal or not)
                if "returns" not in batch:  # only empty responses here: no token to fit, but
                    # the same stats on every rank (their sums are all-reduced by position)
                    batch["returns"] = batch["old_values"] = torch.zeros_like(batch["mask"])
                with self._compute():
                    v_loss, v_stats = self.critic.loss(batch)
                (v_loss * weight).backward()
                stats.update(v_stats)
            for k, v in {"loss": loss.item(), **stats}.items():
                sums[k] = sums.get(k, 0.0) + float(v) * weight * share
            # the rollout engine against this forward on the tokens the same weights sampled
            # (verl's rollout_probs_diff): float rounding alone when both compute alike; the
            # numerics' mismatch (bf16, another engine, MoE routing flips) otherwise. Summed
            # as |difference| and count on every rank, divided after the all-reduce.
            gap = count = 0.0
            if first:
                same = (batch["mask"] > 0) & (batch["versions"] == self.version)
                gap = float((logp.detach() - batch["old"]).abs()[same].sum())
                count = float(same.sum())
            sums["rollout_gap_abs"] = sums.get("rollout_gap_abs", 0.0) + gap
            sums["rollout_gap_tokens"] = sums.get("rollout_gap_tokens", 0.0) + count
        grad_norm = (self.optim.step(self.group, self.tc.max_grad_norm) if policy_steps
                     else 0.0)
        critic_norm = (self.critic.optim.step(self.group, self.tc.max_grad_norm)
                       if self.critic is not None else None)
        return grad_norm, critic_norm

    def _proximal(self, seqs: list[TrainSeq]) -> dict[int, torch.Tensor]:
        """Each sequence's response logprobs under the weights the step starts from."""
        out: dict[int, torch.Tensor] = {}
        for part in micro_batches(seqs, self.tc.micro_batch_tokens):
            packed = pack_routing(pack(part), part, self.model.config)
            batch = {k: v.to(self.device) for k, v in packed.items()}
            with torch.no_grad(), self._compute():
                logp = response_logprobs(self.model, batch, self.tc.logits_chunk_tokens).cpu()
            for i, s in enumerate(part):
                out[s.job_id] = logp[i, : len(s.response_ids)]
        return out

    @property
    def base_is_reference(self) -> bool:
        """Under LoRA with a KL penalty the frozen base is the reference (the policy's weights
        before training, as ``<model>.ref`` holds them): no reference stage is needed, and
        samples that carry a reference stage's logprobs keep them."""
        return bool(self.tc.lora_rank) and self.tc.kl_coef > 0

    def _base_logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The response tokens' logprobs under the base model (the adapters left out)."""
        with torch.no_grad(), adapters_off(self.model), self._compute():
            return response_logprobs(self.model, batch, self.tc.logits_chunk_tokens)

    def _compute(self) -> contextlib.AbstractContextManager[object]:
        """bf16 autocast over the float32 weights when the run computes in bf16."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The policy under Hugging Face names, what every version publishes (the adapters
        merged in, under LoRA)."""
        sd = merged_state_dict(self.model) if self.tc.lora_rank else self.model.state_dict()
        if self.config.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        return sd

    def publish_state(self) -> list[str]:
        """Publish this rank's part of what the pool's next trainer needs beside the policy:
        AdamW's state, and under LoRA the adapters (the policy holds them only merged)."""
        return publish_state(self.store, self.model_name, self.version, self.optim, self.group,
                             adapter_tensors(self.model), self.hf_config)

    def weight_tensors(self) -> list[torch.Tensor]:
        """The weights ranks must agree on, in one order: the policy's, then the critic's (the
        optimizers' states follow in their ``regroup``)."""
        with torch.no_grad():
            params = [p.data for p in self.model.parameters()]
        critic = self.critic.weight_tensors() if self.critic is not None else []
        return params + critic

    def load_from_store(self, version: int) -> None:
        """Take over the pool's state at ``version``: the policy, and the optimizer state rank 0
        published with it (waits for it: on a cluster it may still be crossing to this node)."""
        take_over(self.store, self.model_name, version, self.model, self.optim, "lora_rank",
                  self.tc.lora_rank)
        if self.critic is not None:
            self.critic.load_from_store(version)

    def release(self) -> None:
        """Leave the group and free the model; the optimizer state is already in the store
        (rank 0 publishes it with every version), so the next trainer takes it from there."""
        self.group.leave()
        if self.critic is not None:
            self.critic.release()
        del self.model, self.optim
