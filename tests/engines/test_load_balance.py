"""A mixture of experts' load-balancing loss (``router_aux_loss_coef``): the trainer's
``LoadBalance`` gives transformers' Qwen3-MoE ``aux_loss`` on a padded batch and the same
gradient into every weight, with or without gradient checkpointing; with routing replay it
counts the experts the rollout used."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_fixtures import MOE, PROMPTS, hf_model

from pivotflow.engines.torch import load_model_folder
from pivotflow.engines.torch.feedforward import LoadBalance
from pivotflow.engines.torch.model import Decoder
from pivotflow.engines.torch.weights import build_model
from pivotflow.worker.train_config import check_train_options

E, K = MOE.extra["num_experts"], MOE.extra["num_experts_per_tok"]


def _padded() -> tuple[torch.Tensor, torch.Tensor]:
    """PROMPTS right-padded into one batch, and its attention mask."""
    width = max(map(len, PROMPTS))
    ids = torch.tensor([p + [0] * (width - len(p)) for p in PROMPTS])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in PROMPTS])
    return ids, mask


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """transformers' Qwen3-MoE of the shared fixtures, as it saves it (hf_model(MOE) again
    gives the same weights)."""
    root = tmp_path_factory.mktemp("moe")
    hf_model(MOE).save_pretrained(root)
    return root


def _ours(folder: Path, checkpointing: bool = False) -> Decoder:
    saved = load_model_folder(folder)
    model = build_model(saved.config, saved.tensors)
    model.requires_grad_(True)
    model.gradient_checkpointing = checkpointing
    return model.train()


def _aux(model: Decoder, ids: torch.Tensor, mask: torch.Tensor,
         routing: torch.Tensor | None = None) -> torch.Tensor:
    balance = LoadBalance(E, mask)
    model.hidden_states(ids, attention_mask=mask, routing=routing, balance=balance)
    return balance.loss()


def test_the_loss_and_every_gradient_equal_transformers_aux_loss(folder: Path) -> None:
    theirs = hf_model(MOE).train()
    ids, mask = _padded()
    reference = theirs(ids, attention_mask=mask, output_router_logits=True).aux_loss
    reference.backward()
    theirs_grads = {n: p.grad for n, p in theirs.named_parameters()}
    for checkpointing in (False, True):
        ours = _ours(folder, checkpointing)
        got = _aux(ours, ids, mask)
        torch.testing.assert_close(got, reference, atol=1e-6, rtol=1e-6)
        assert float(got) > K * 0.99  # (k when balanced: this random router is not)
        got.backward()
        for name, p in ours.named_parameters():
            expected = _their_grad(theirs_grads, name)
            if expected is None:  # the head, the last norm and the last layer's experts: no
                # router reads what they compute
                assert p.grad is None or not p.grad.any(), name
            else:
                torch.testing.assert_close(p.grad, expected, atol=1e-6, rtol=1e-5, msg=name)
        assert ours.model.layers[0].mlp.gate.weight.grad.abs().sum() > 0
        assert ours.model.layers[0].mlp.experts[0].up_proj.weight.grad.abs().sum() > 0


def _their_grad(grads: dict[str, torch.Tensor | None], name: str) -> torch.Tensor | None:
    """transformers' gradient of our parameter ``name``: an expert's is its slice of the fused
    tensor (gate_up_proj: gate's rows, then up's), None where there is none."""
    parts = name.split(".")  # model.layers.0.mlp.experts.3.up_proj.weight
    if "experts" not in parts:
        return grads[name]
    at = parts.index("experts")
    expert, proj, fused = int(parts[at + 1]), parts[at + 2], ".".join(parts[: at + 1])
    inter = MOE.extra["moe_intermediate_size"]
    if proj == "down_proj":
        grad = grads[f"{fused}.down_proj"]
        return None if grad is None else grad[expert]
    grad = grads[f"{fused}.gate_up_proj"]
    if grad is None:
        return None
    return grad[expert][:inter] if proj == "gate_proj" else grad[expert][inter:]


class _Seen(LoadBalance):
    """LoadBalance that also keeps what each sparse layer gave it."""

    def __init__(self, valid: torch.Tensor) -> None:
        super().__init__(E, valid)
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def add(self, router_logits: torch.Tensor, chosen: torch.Tensor,
            scoring: str = "softmax") -> None:
        self.seen.append((router_logits, chosen))
        super().add(router_logits, chosen, scoring)


def test_with_routing_replayed_it_counts_the_rollouts_experts(folder: Path) -> None:
    ids, mask = _padded()
    ours = _ours(folder)
    # every token of every sparse layer sent to experts 0 and 1: each has f = 1, the rest 0
    routing = torch.tensor([0, 1]).expand(*ids.shape, ours.config.sparse_layers, K)
    seen = _Seen(mask)
    with torch.no_grad():
        ours.hidden_states(ids, attention_mask=mask, routing=routing, balance=seen)
    real = mask.reshape(-1).bool()
    assert len(seen.seen) == ours.config.sparse_layers
    assert all(torch.equal(chosen[real].sort(-1).values, torch.tensor([[0, 1]]).expand(
        int(real.sum()), K)) for _, chosen in seen.seen)  # fmt: skip
    probs = torch.cat([logits.softmax(-1)[real] for logits, _ in seen.seen])
    torch.testing.assert_close(seen.loss(), E * probs[:, :2].sum(-1).mean(), atol=1e-6,
                               rtol=1e-6)


def test_a_forward_without_sparse_layers_adds_nothing_and_the_knob_is_checked() -> None:
    assert float(LoadBalance(E).loss()) == 0.0
    assert check_train_options({"router_aux_loss_coef": 0.001}).router_aux_loss_coef == 0.001
    with pytest.raises(ValueError, match=r"^router_aux_loss_coef must be a number >= 0, got -1"):
        check_train_options({"router_aux_loss_coef": -1.0})
