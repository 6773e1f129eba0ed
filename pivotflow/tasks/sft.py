"""Supervised fine-tuning of a `Decoder` on (prompt, completion) pairs, and its exact metrics.

Every sequence is ``prompt completion EOS``, each part encoded on its own by the model's
tokenizer (``prompt_ids``: a BOS only where the tokenizer's post-processor adds one, as Llama 3's
does; the built-in one, like Qwen's, has none), so training sees the tokens a rollout produces:
the prompt's ids, then the generated ones. The loss counts only the completion and EOS.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import msgspec
import torch
import torch.nn.functional as F
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from pivotflow.engines.torch.model import Decoder
from pivotflow.errors import ConfigError
from pivotflow.tokenizer.base import Tokenizer

Pair = tuple[str, str]


class SFTConfig(msgspec.Struct, kw_only=True, frozen=True):
    """How to fine-tune. ``schedule`` is "cosine" (to 10% of lr) or "constant", after a linear
    warmup of ``warmup_steps``; ``eval_every`` is how often the stop callback is asked."""

    steps: int = 1000
    batch_size: int = 256
    lr: float = 3e-4
    warmup_steps: int = 0
    schedule: str = "cosine"
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    threads: int | None = 2  # None keeps torch's current setting
    seed: int = 0
    eval_every: int = 200

    def validate(self) -> SFTConfig:
        """Return self; raise ConfigError naming the first bad field."""
        if self.schedule not in ("cosine", "constant"):
            raise ConfigError(f"sft.schedule must be 'cosine' or 'constant', got {self.schedule!r}")
        for name in ("steps", "batch_size", "eval_every"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"sft.{name} must be positive, got {getattr(self, name)}")
        if self.lr <= 0 or self.warmup_steps < 0:
            raise ConfigError(
                f"sft.lr must be > 0 and warmup_steps >= 0 ({self.lr}, {self.warmup_steps})"
            )
        return self


class SFTResult(msgspec.Struct, kw_only=True):
    """What a run did: the loss every step, steps taken, wall seconds, whether it stopped early."""

    losses: list[float]
    steps: int
    seconds: float
    stopped_early: bool


def prompt_ids(tok: Tokenizer, prompt: str) -> list[int]:
    """The ids a raw-text prompt starts a sequence with (what the rollout sends the engine);
    ConfigError if there are none (without a BOS, nothing to predict the first token from)."""
    ids = tok.encode(prompt, add_special_tokens=True)
    if not ids:
        raise ConfigError(f"sft prompt {prompt[:40]!r} encodes to no tokens")
    return ids


def pad_right(seqs: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """[N, T] long tensor of ``seqs`` right-padded with ``pad_id`` to the longest."""
    width = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out


def encode_pairs(tok: Tokenizer, pairs: Sequence[Pair]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [N, T] of ``prompt completion EOS`` and a target mask [N, T-1] that is
    1 where ``ids[:, 1:]`` is a completion token or EOS. A prompt must encode to at least one
    token (the first one is never a target)."""
    seqs, spans = [], []
    for prompt, completion in pairs:
        p = prompt_ids(tok, prompt)
        c = tok.encode(completion) + [tok.eos_id]
        seqs.append(p + c)
        spans.append((len(p), len(p) + len(c)))
    ids_t = pad_right(seqs, tok.pad_id)
    mask = torch.zeros(ids_t.shape[0], max(ids_t.shape[1] - 1, 0), dtype=torch.bool)
    for row, (start, end) in enumerate(spans):
        mask[row, start - 1 : end - 1] = True  # logits at t predict token t+1
    return ids_t, mask


def sequence_lengths(mask: torch.Tensor) -> torch.Tensor:
    """Each row's length from its target mask (the last target is the sequence's last token):
    the pad id may equal EOS (it does for Qwen and the built-in models), so counting non-pad
    ids would not do."""
    last = mask.shape[1] - 1 - mask.flip(1).to(torch.uint8).argmax(1)
    return last + 2


def _lr_factor(step: int, cfg: SFTConfig) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))


def train_sft(
    model: Decoder,
    tok: Tokenizer,
    pairs: Sequence[Pair],
    cfg: SFTConfig,
    *,
    should_stop: Callable[[int], bool] | None = None,
    progress: bool = True,
    description: str = "sft",
) -> SFTResult:
    """Fine-tune ``model`` in place on ``pairs`` for ``cfg.steps`` AdamW steps on random batches.

    Every ``cfg.eval_every`` steps (and after the last) ``should_stop(step)`` is called with the
    model in eval mode; True ends training there. Raises ConfigError for a bad config and
    TokenizerError where the tokenizer cannot encode the text.
    """
    cfg.validate()
    if not pairs:
        raise ConfigError("sft needs at least one (prompt, completion) pair")
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    ids, mask = encode_pairs(tok, pairs)
    lengths = sequence_lengths(mask)
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98)
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, cfg))
    losses: list[float] = []
    stopped = False
    start = time.perf_counter()
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
        disable=not progress,
    )
    with bar:
        bar_task = bar.add_task(description, total=cfg.steps, loss=float("nan"))
        model.train()
        batches: list[torch.Tensor] = []
        for step in range(1, cfg.steps + 1):
            if not batches:
                batches = _length_grouped_batches(lengths, cfg.batch_size, gen)
            idx = batches.pop()
            loss = sft_loss(model, ids[idx], mask[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            losses.append(loss.item())
            bar.update(bar_task, advance=1, loss=losses[-1])
            if should_stop is not None and (step % cfg.eval_every == 0 or step == cfg.steps):
                model.eval()
                stopped = should_stop(step) and step < cfg.steps
                model.train()
                if stopped:
                    break
    model.eval()
    return SFTResult(
        losses=losses, steps=len(losses), seconds=time.perf_counter() - start, stopped_early=stopped
    )


def _length_grouped_batches(
    lengths: torch.Tensor, batch_size: int, gen: torch.Generator, group: int = 16
) -> list[torch.Tensor]:
    """``group`` random batches in random order, where the few sequences much longer than the
    median were moved together into the last batches of the group.

    A rare long sequence (the judge's garbage candidates are up to 2x the usual length) then no
    longer pads a whole batch of short ones to its width. Typical lengths are not sorted, since
    that would make batches all-"Yes" or all-"No" (their targets differ by one token).
    """
    idx = torch.randint(0, lengths.shape[0], (batch_size * group,), generator=gen)
    chosen = lengths[idx]
    typical = int(chosen.float().median()) * 5 // 4 + 1
    key = torch.where(chosen <= typical, 0, chosen)
    idx = idx[torch.argsort(key, stable=True)]
    chunks = list(idx.split(batch_size))
    order = torch.randperm(len(chunks), generator=gen).tolist()
    return [chunks[i] for i in order]


def sft_loss(model: Decoder, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over the masked (completion + EOS) targets of a right-padded batch."""
    width = int(mask.any(0).nonzero().max()) + 2  # drop all-pad columns
    ids, mask = ids[:, :width], mask[:, : width - 1]
    logits = model(ids[:, :-1])  # causal: right padding never reaches a real position
    return F.cross_entropy(logits[mask], ids[:, 1:][mask])


@torch.no_grad()
def teacher_forced_accuracy(
    model: Decoder, tok: Tokenizer, pairs: Sequence[Pair], batch_size: int = 1024
) -> float:
    """Fraction of pairs whose completion + EOS is the argmax at every target position.

    This equals greedy decoding's exact-match accuracy with one forward pass: greedy decoding
    writes the argmax after the prompt; while every argmax equals the target, its input is the
    target prefix, i.e. exactly the teacher-forced input, so it writes the whole completion and
    stops at EOS iff every teacher-forced argmax matches; at the first mismatch greedy output
    diverges from the target and can no longer be an exact match.
    """
    if not pairs:
        return 0.0
    was_training = model.training
    model.eval()
    hits = 0
    for lo in range(0, len(pairs), batch_size):
        ids, mask = encode_pairs(tok, pairs[lo : lo + batch_size])
        pred = model(ids[:, :-1]).argmax(-1)
        ok = (pred == ids[:, 1:]) | ~mask
        hits += int(ok.all(dim=1).sum())
    model.train(was_training)
    return hits / len(pairs)


@torch.no_grad()
def greedy_complete(
    model: Decoder,
    tok: Tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int,
    batch_size: int = 512,
) -> list[str]:
    """Greedy continuation text of each prompt, up to a stop token (``tok.eos_ids``) or
    ``max_new_tokens``; special tokens are dropped from the text.

    Full forward passes without a KV cache: sequences here are ~15 tokens, so recomputing is
    cheap and the result does not depend on any engine.
    """
    was_training = model.training
    model.eval()
    encoded = [prompt_ids(tok, p) for p in prompts]
    # Similar lengths share a batch so few positions are padding; results go back in order.
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    out: list[str] = [""] * len(encoded)
    for lo in range(0, len(order), batch_size):
        members = order[lo : lo + batch_size]
        for i, text in zip(
            members,
            _greedy_batch(model, tok, [encoded[i] for i in members], max_new_tokens),
            strict=False,
        ):
            out[i] = text
    model.train(was_training)
    return out


def _greedy_batch(
    model: Decoder, tok: Tokenizer, chunk: list[list[int]], max_new_tokens: int
) -> list[str]:
    lens = torch.tensor([len(c) for c in chunk])
    ids = pad_right(chunk, tok.pad_id)
    buf = torch.full((len(chunk), int(lens.max()) + max_new_tokens), tok.pad_id)
    buf[:, : ids.shape[1]] = ids
    stops = set(tok.eos_ids)
    done = torch.zeros(len(chunk), dtype=torch.bool)
    gen: list[list[int]] = [[] for _ in chunk]
    rows = torch.arange(len(chunk))
    for _ in range(max_new_tokens):
        # Right padding + causal attention: a row's last real position never sees its padding.
        logits = model(buf[:, : int(lens.max())])
        nxt = logits[rows, lens - 1].argmax(-1)
        for r in (~done).nonzero().flatten().tolist():
            if int(nxt[r]) in stops:
                done[r] = True
            else:
                gen[r].append(int(nxt[r]))
        buf[rows, lens] = torch.where(done, tok.pad_id, nxt)
        lens = lens + (~done).long()
        if bool(done.all()):
            break
    return [tok.decode(g) for g in gen]
