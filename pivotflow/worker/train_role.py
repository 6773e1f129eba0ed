"""The train role: GRPO-style policy-gradient steps that publish each new policy version."""

from __future__ import annotations

import time

import torch

from pivotflow.engines.torch.model import Decoder, token_logprobs
from pivotflow.params.base import ParamStore
from pivotflow.protocol import TrainDone, TrainSeq, TrainStep
from pivotflow.rl import policy_loss


def pack(seqs: list[TrainSeq], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded prompt+response ids, with response-token positions and their old logprobs.

    Position ``p`` of ``logits`` predicts token ``p + 1``, so the response token at index ``j``
    (absolute position ``len(prompt) + j``) is scored by logits at ``len(prompt) + j - 1``.
    """
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in seqs)
    resp = max(max(len(s.response_ids) for s in seqs), 1)
    b = len(seqs)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros(b, width, dtype=torch.long)
    gather = torch.zeros(b, resp, dtype=torch.long)  # logit position of each response token
    targets = torch.zeros(b, resp, dtype=torch.long)
    old = torch.zeros(b, resp)
    mask = torch.zeros(b, resp)
    for i, s in enumerate(seqs):
        p, r = len(s.prompt_ids), len(s.response_ids)
        ids[i, : p + r] = torch.tensor(s.prompt_ids + s.response_ids)
        attn[i, : p + r] = 1
        gather[i, :r] = torch.arange(p - 1, p + r - 1)
        targets[i, :r] = torch.tensor(s.response_ids, dtype=torch.long)
        old[i, :r] = torch.tensor(s.logprobs)
        lm = s.loss_mask if s.loss_mask else [1] * r
        mask[i, :r] = torch.tensor(lm, dtype=torch.float32)
    adv = torch.tensor([s.advantage for s in seqs], dtype=torch.float32)
    return {"ids": ids, "attn": attn, "gather": gather, "targets": targets, "old": old,
            "mask": mask, "adv": adv}


class TrainRole:
    """Holds the policy and its AdamW state; one ``train`` call is one optimizer step."""

    def __init__(self, store: ParamStore, model: str, options: dict) -> None:
        self.store, self.model_name = store, model
        t0 = time.perf_counter()
        self.version, self.config, tensors = store.load(model)
        self.model = Decoder(self.config)
        self.model.load_state_dict(tensors, strict=False)
        self.model.train()
        self.opts = options
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=float(options.get("lr", 3e-4)),
                                       betas=(0.9, 0.99), weight_decay=0.0)
        self.load_s = time.perf_counter() - t0

    def train(self, msg: TrainStep) -> TrainDone:
        t0 = time.perf_counter()
        batch = pack(msg.seqs)
        logits = self.model(batch["ids"], attention_mask=batch["attn"])
        pos = batch["gather"].unsqueeze(-1).expand(-1, -1, logits.shape[-1])
        logp = token_logprobs(logits.gather(1, pos), batch["targets"])
        loss, stats = policy_loss(
            logp, batch["old"], batch["adv"], batch["mask"],
            clip_eps=float(self.opts.get("clip_eps", 0.2)),
            aggregation=str(self.opts.get("aggregation", "token-mean")),
        )
        self.optim.zero_grad(set_to_none=True)
        grad_norm = torch.zeros(())
        # A batch whose advantages are all zero carries no signal; stepping Adam on it would
        # still move every weight along its stale momentum.
        if bool(batch["adv"].abs().gt(0).any()):
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), float(self.opts.get("max_grad_norm", 1.0)))
            self.optim.step()
        self.version = msg.step + 1
        self.store.publish(self.model_name, self.version, self.state_dict(), self.config)
        self.store.gc(self.model_name, keep=3)
        out = {"loss": float(loss), "grad_norm": float(grad_norm),
               "step_s": time.perf_counter() - t0}
        out.update({k: float(v) for k, v in stats.items()})
        return TrainDone(step=msg.step, version=self.version, stats=out,
                         job_ids=[s.job_id for s in msg.seqs])

    def state_dict(self) -> dict[str, torch.Tensor]:
        sd = self.model.state_dict()
        if self.config.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        return sd

    def release(self) -> None:
        del self.model, self.optim
