"""The trainer's memory knobs (``gradient_checkpointing``, ``logits_chunk_tokens``) trade
compute for memory and change nothing else: the same step, the same weights, the same reported
loss and entropy; and what autograd keeps for the backward pass shrinks. The output head never
sees a padding position. (What they save and cost in bytes and seconds: bench/train_memory.py.)
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch
from test_train_group import batch

from pivotflow.controller.train_tokens import valid_tokens
from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.engines.torch.weights import config_to_hf
from pivotflow.params.shm_store import ShmParamStore
from pivotflow.protocol import TrainStep
from pivotflow.rl import policy_loss
from pivotflow.worker.response_scoring import response_logprobs_entropy
from pivotflow.worker.train_config import check_train_options
from pivotflow.worker.train_role import TrainRole, pack

pytestmark = pytest.mark.timeout(120)

# two layers, so a recomputed layer feeds another; the vocabulary much wider than the model,
# as a real one is, so the head's tensors are what a step holds most of
CFG = ModelConfig(vocab_size=2048, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)


def store_at(root: Path) -> ShmParamStore:
    store = ShmParamStore(root)
    torch.manual_seed(0)
    store.publish("policy", 0, Decoder(CFG).state_dict(), config_to_hf(CFG, torch.float32))
    return store


def message(step: int) -> TrainStep:
    seqs = batch(step)  # six sequences of mixed prompt and response lengths
    return TrainStep(step=step, seqs=seqs, rank=0, world=1, epoch=1, rendezvous="",
                     total_tokens=sum(valid_tokens(s) for s in seqs), total_seqs=len(seqs))


@pytest.mark.parametrize("entropy_coef", [0.0, 0.3])
@pytest.mark.parametrize(("checkpointing", "chunk"), [(True, 0), (False, 5), (True, 3)])
def test_the_memory_knobs_take_the_same_steps(tmp_path: Path, checkpointing: bool, chunk: int,
                                              entropy_coef: float) -> None:
    """Two optimizer steps with each knob against the same two without: the same weights, loss
    and entropy (a chunk of 3 or 5 cuts the 6 sequences' 20 response tokens unevenly)."""
    runs = []
    for knobs in ({}, {"gradient_checkpointing": checkpointing, "logits_chunk_tokens": chunk}):
        role = TrainRole(store_at(tmp_path / f"store-{len(runs)}"), "policy",
                         {"lr": 1e-2, "entropy_coef": entropy_coef, **knobs})
        stats = [role.train(message(step)).stats for step in (0, 1)]
        runs.append((role.state_dict(), stats))
    (plain, plain_stats), (knobbed, knobbed_stats) = runs
    for name, weight in plain.items():
        # Chunks sum the head's gradient in another order. Rounding, which Adam's first steps
        # scale up to a step of about lr for the rows no target names (their gradients are
        # rounding-sized): 5e-4 is 5% of such a step; a wrong gradient moves weights by lr.
        # (Measured 12-05 on an AVX-512 AMD EPYC under the entropy term: up to 1.75e-4, where
        # the 5e-5 this allowed before held on the machines before it.)
        torch.testing.assert_close(weight, knobbed[name], rtol=1e-4, atol=5e-4, msg=name)
    for a, b in zip(plain_stats, knobbed_stats, strict=True):
        for key in ("loss", "pg_loss", "entropy", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key


def saved_for_backward(model: Decoder, batch: dict[str, torch.Tensor], chunk: int,
                       ) -> tuple[int, int]:
    """The bytes autograd keeps from one trainer forward and loss for the backward pass, and
    the most elements any one kept tensor has."""
    kept: list[torch.Tensor] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        logp, entropy = response_logprobs_entropy(model, batch, "grad", chunk)
        loss, _ = policy_loss(logp, batch["old"], batch["adv"], batch["mask"],
                              entropy=entropy, entropy_coef=0.1)
    loss.backward()
    params = {p.data_ptr() for p in model.parameters()}
    activations = [t for t in kept if t.data_ptr() not in params]
    return (sum(t.numel() * t.element_size() for t in activations),
            max(t.numel() for t in activations))


def test_the_knobs_shrink_what_autograd_keeps() -> None:
    """Without them a step keeps vocabulary-wide tensors for every response position, and each
    layer's intermediates; with a chunk no kept tensor is vocabulary-wide over more positions
    than the chunk, and with checkpointing the layers' intermediates are not kept either."""
    torch.manual_seed(0)
    vocab = 8192  # (wider still: the head's share of a real step, e.g. Qwen2.5-0.5B's)
    model = Decoder(msgspec.structs.replace(CFG, vocab_size=vocab)).train()
    data = pack(batch(0))
    positions = int(data["valid"].sum())
    plain_bytes, plain_widest = saved_for_backward(model, data, 0)
    assert plain_widest >= positions * vocab  # (the logits of every position)
    chunk_bytes, chunk_widest = saved_for_backward(model, data, 4)
    assert chunk_widest <= 4 * vocab and chunk_bytes < plain_bytes / 4
    model.gradient_checkpointing = True
    both_bytes, _ = saved_for_backward(model, data, 4)
    assert both_bytes < chunk_bytes / 2


def test_the_head_never_sees_padding() -> None:
    """Responses of 2 to 5 tokens padded to 5: the head's input rows are the response tokens,
    the padding's log-probabilities are 0, and chunks give what the whole gives."""
    torch.manual_seed(0)
    model = Decoder(CFG)
    seqs = batch(0)
    data = pack(seqs)
    rows: list[int] = []
    model.lm_head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[0]))
    with torch.no_grad():
        logp, _ = response_logprobs_entropy(model, data, "none")
        chunked, _ = response_logprobs_entropy(model, data, "none", chunk=4)
    assert rows == [sum(len(s.response_ids) for s in seqs)] and rows[0] < data["valid"].numel()
    assert bool((logp[~data["valid"]] == 0).all()) and bool((logp[data["valid"]] < 0).all())
    torch.testing.assert_close(chunked, logp)


@pytest.mark.parametrize("cap", [0.0, 2.0], ids=["plain", "soft-capped"])
@pytest.mark.parametrize("entropy", ["grad", "report", "none"])
@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_the_chunked_heads_gradient_is_autograds(entropy: str, chunk: int, cap: float) -> None:
    """``ChunkedHeadScore`` writes the head's gradient by hand: against autograd through the
    whole log-softmax, for any upstream gradients of both outputs (7 positions, a vocabulary of
    50, chunks that do and do not divide them), to float32's rounding (both take the
    log-softmax in float32; a wrong term is off by the gradient's own size); through Gemma 2's
    soft cap on the logits too (2: binding on these)."""
    from pivotflow.engines.torch.model import LMHead
    from pivotflow.worker.response_scoring import ChunkedHeadScore, score_positions

    g = torch.Generator().manual_seed(chunk)
    hidden = torch.randn(7, 6, generator=g)
    weight = torch.randn(50, 6, generator=g)
    targets = torch.randint(0, 50, (7,), generator=g)
    up_logp, up_ent = torch.randn(7, generator=g), torch.randn(
        7, generator=g)
    results = []
    for chunked in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if chunked:
            logp, ent = ChunkedHeadScore.apply(h, w, targets, chunk, entropy, cap)
        else:
            head = LMHead(6, 50, cap)
            head.weight = torch.nn.Parameter(w)
            logp, ent = score_positions(head, h, targets, entropy)  # type: ignore[arg-type]
            w = head.weight
        loss = (logp * up_logp).sum()
        if entropy == "grad":
            loss = loss + (ent * up_ent).sum()
        loss.backward()
        results.append((logp, ent, h.grad, w.grad))
    (logp, ent, gh, gw), (c_logp, c_ent, c_gh, c_gw) = results
    torch.testing.assert_close(c_logp, logp)
    if entropy != "none":
        torch.testing.assert_close(c_ent, ent)
    torch.testing.assert_close(c_gh, gh, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(c_gw, gw, rtol=1e-4, atol=1e-5)


def test_the_chunked_head_under_bf16_autocast() -> None:
    """Under bf16 autocast (``dtype=bf16`` over float32 weights) the chunked head's matmuls run
    in bf16, as the plain head's do: the same figures to bf16's precision."""
    from pivotflow.worker.response_scoring import ChunkedHeadScore, score_positions

    torch.manual_seed(0)
    head = torch.nn.Linear(32, 300, bias=False)
    hidden = torch.randn(9, 32)
    targets = torch.randint(0, 300, (9,))
    grads = []
    for chunked in (False, True):
        head.weight.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp, ent = (ChunkedHeadScore.apply(hidden, head.weight, targets, 4, "grad")
                         if chunked else score_positions(head, hidden, targets, "grad"))
        (logp.sum() + ent.sum()).backward()
        grads.append((logp.detach(), head.weight.grad.clone()))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=2e-2, atol=2e-3)


def test_a_bad_chunk_names_the_knob() -> None:
    with pytest.raises(ValueError, match="logits_chunk_tokens must be >= 0"):
        check_train_options({"logits_chunk_tokens": -2})
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        check_train_options({"gradient_checkpointing": "sometimes"})


@pytest.mark.parametrize("changes", [
    {"architecture": "granite", "logits_scaling": 4.0, "embedding_multiplier": 3.0,
     "residual_multiplier": 0.5},
    {"architecture": "gemma2", "final_logit_softcapping": 2.0, "attn_logit_softcapping": 5.0,
     "hidden_act": "gelu_pytorch_tanh", "qk_norm": False},
], ids=["granite-logits-scaling", "gemma2-softcap"])
def test_chunks_give_what_the_whole_head_gives_on_a_scaled_or_capped_head(
        changes: dict[str, object]) -> None:
    """Granite's head divides its logits, Gemma 2's caps them: the chunked head (which takes
    the weight, not the module) scores and differentiates as the whole head does."""
    torch.manual_seed(0)
    model = Decoder(msgspec.structs.replace(CFG, **changes)).train()
    data = pack(batch(0))
    grads = []
    for chunk in (0, 3):
        model.zero_grad()
        logp, ent = response_logprobs_entropy(model, data, "grad", chunk=chunk)
        assert ent is not None
        (logp.sum() + ent.sum()).backward()
        grads.append((logp.detach(), model.lm_head.weight.grad.clone()))
    torch.testing.assert_close(grads[1][0], grads[0][0])
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-4, atol=1e-5)
