"""The embedded PyTorch engine: a slot KV cache and continuous batching on CPU or GPU.

Each ``step()`` admits waiting requests into free slots (batched prefills, joiners of similar
length together, that also sample their first token), then runs one decode step over every
running slot at once. A request leaves its slot the moment it finishes and is returned from
that same step. Per-sequence state (tokens,
logprobs, versions, limits, stop ids) lives in per-slot tensors, so a step does no Python work per
running request except for requests with stop strings. Both passes run through
``kv_cache.PackedDecoder``, the model's forward specialised for the slot cache.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from pivotflow import defaults
from pivotflow.batching import prefill_groups
from pivotflow.engines.base import FinishReason, GenerationOutput, GenerationRequest
from pivotflow.engines.torch.experts import RoutingRecorder
from pivotflow.engines.torch.kv_cache import PackedDecoder
from pivotflow.engines.torch.kv_groups import ServingCache, serving_cache
from pivotflow.engines.torch.model import Decoder, ModelConfig
from pivotflow.engines.torch.sampling import SlotResponses, SlotSampler, seed_key
from pivotflow.engines.torch.weights import build_model, resolve_dtype
from pivotflow.errors import EngineError, RequestError

# The slot cache holds max_batch x max_seq_len positions up front: a real model's
# max_position_embeddings (32768 for Qwen2.5-0.5B) would make that ~26 GB at 64 slots in bf16,
# so the default context stops here; pass max_seq_len for longer ones.
DEFAULT_MAX_SEQ_LEN = 4096


@dataclass(slots=True)
class _Seq:
    request: GenerationRequest
    limit: int  # most response tokens (prefix included) this engine's context allows
    key: int  # sampling noise key, from the seed (drawn at add time when the seed is None)
    window: int  # trailing tokens to decode when checking stop strings (0: none)


class TorchEngine:
    """Continuous-batching inference over a ``Decoder`` (implements ``engines.base.Engine``).

    Weights arrive through ``load_weights`` (HF names, any float dtype: they are cast to
    ``dtype``); until then serving raises EngineError. The model runs in ``dtype`` (a torch dtype
    or a name: float32|bfloat16|float16|fp32|bf16|fp16) on ``device``; logits are taken to
    float32 before sampling. Returned logprobs are log p(token) under the raw model
    distribution, before temperature and top-p (see ``sampling``). Tokens are stamped with
    ``version`` as it was when they were sampled. Every id in ``eos_token_ids`` (a real model's
    generation config often has several) ends a request, as do its own stop ids;
    ``eos_token_id`` is the older one-id spelling, added to them. ``max_seq_len`` (prompt plus
    response) defaults to the model's context (``ModelConfig.context_limit``), at most
    DEFAULT_MAX_SEQ_LEN.

    ``vocab_limit`` (the tokenizer's size) keeps ids at or above it from ever being sampled:
    a model's embedding is often padded past its tokenizer (Qwen2.5-0.5B: 151936 rows, 151665
    tokens), and an id without text would break decoding. None: every id of the model.
    """

    def __init__(
        self,
        model_config: ModelConfig,
        *,
        max_batch: int = defaults.MAX_BATCH,
        max_seq_len: int | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str = torch.float32,
        eos_token_ids: Sequence[int] = (),
        eos_token_id: int | None = None,
        detokenize: Callable[[list[int]], str] | None = None,
        vocab_limit: int | None = None,
        record_routing: bool = False,
    ) -> None:
        self.config = model_config.validate()
        context = model_config.context_limit  # (LongRoPE: its original context)
        self.max_seq_len = max_seq_len or min(context, DEFAULT_MAX_SEQ_LEN)
        if max_batch < 1 or not 2 <= self.max_seq_len <= context:
            raise EngineError(
                f"TorchEngine needs max_batch >= 1 (got {max_batch}) and 2 <= max_seq_len <= "
                f"{model_config.context_key} {context} (got {max_seq_len})"
            )
        if vocab_limit is not None and not 0 < vocab_limit <= model_config.vocab_size:
            raise EngineError(
                f"vocab_limit {vocab_limit} must be in 1..vocab_size {model_config.vocab_size}"
            )
        if isinstance(dtype, str):
            dtype = resolve_dtype({}, dtype)
        self.max_batch, self.device, self.dtype = max_batch, torch.device(device), dtype
        ids = [*eos_token_ids, *(() if eos_token_id is None else (eos_token_id,))]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(i) for i in ids))
        self.detokenize = detokenize
        self.version = 0
        self._model: Decoder | None = None
        self._decode: PackedDecoder | None = None  # serves from _model's (packed) weights
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []  # index = slot; running sequences fill slots 0..n-1
        self._ids: set[str] = set()
        self._n_stop_strings = 0  # running requests that have stop strings
        self._ready: list[GenerationOutput] = []  # finished at admission; out with the next step
        self._cache: ServingCache | None = None
        # Per-slot responses and sampling parameters are bookkeeping (a few ints per token),
        # kept across release_memory; the KV cache and the weights are what it frees.
        self._resp = SlotResponses(max_batch, self.max_seq_len, self.device)
        limit = None if vocab_limit == model_config.vocab_size else vocab_limit
        self._sampler = SlotSampler(max_batch, self.device, limit)
        # rollout routing replay: each slot's expert choices, returned with its output
        self._routing: RoutingRecorder | None = None
        if record_routing:
            if not model_config.sparse_layers:
                raise EngineError(
                    "record_routing needs a mixture-of-experts model (a qwen3_moe or mixtral "
                    f"with num_experts > 0); this one is a dense {model_config.architecture}"
                )
            self._routing = RoutingRecorder(model_config, max_batch, self.max_seq_len,
                                            self.device)  # fmt: skip
        self.resume_memory()

    # ---- the Engine interface ------------------------------------------------------------

    def add_request(self, request: GenerationRequest) -> None:
        """Queue ``request``. Raises RequestError (naming it) for an invalid request, EngineError
        when no weights are loaded; the engine keeps serving the others either way."""
        self._serving()
        self._check(request)
        p, n_prompt = request.params, len(request.prompt_ids)
        # A stop string spans at most len(s) tokens; the slack covers tokens that print nothing.
        window = max(len(s) for s in p.stop_strings) + 8 if p.stop_strings else 0
        limit = min(p.max_tokens, self.max_seq_len - n_prompt)
        self._waiting.append(_Seq(request, limit, seed_key(p.seed), window))
        self._ids.add(request.request_id)

    @torch.inference_mode()
    def step(self) -> list[GenerationOutput]:
        """Admit and prefill waiting requests, decode one token for every running one; return
        the requests that finished. Raises EngineError when serving without weights."""
        done, self._ready = self._ready, []
        if not (self._waiting or self._running):
            return done
        decoder, cache = self._serving()
        if self._waiting and len(self._running) < self.max_batch:
            done += self._admit()
        if self._running:
            n = len(self._running)
            last = self._resp.last_tokens(n)
            positions = cache.begin_decode(n)
            if self._routing is not None:
                self._routing.at_decode(positions)
            done += self._record(0, decoder.decode(last, positions, cache))
        return done

    def has_work(self) -> bool:
        """Whether any request is waiting, running or finished but not yet returned."""
        return bool(self._waiting or self._running or self._ready)

    @torch.inference_mode()
    def abort(self, request_id: str) -> GenerationOutput | None:
        """Stop ``request_id``; return its partial state (None if unknown or already finished)."""
        for seq in self._waiting:
            if seq.request.request_id == request_id:
                self._waiting.remove(seq)
                return self._prefix_output(seq, "abort")
        for slot, seq in enumerate(self._running):
            if seq.request.request_id == request_id:
                out = self._slot_output(slot, "abort")
                self._remove(slot)
                return out
        return None

    @torch.inference_mode()
    def abort_all(self) -> list[GenerationOutput]:
        """Stop every request; return their partial states (running ones first)."""
        outs = [self._slot_output(s, "abort") for s in range(len(self._running))]
        outs += [self._prefix_output(seq, "abort") for seq in self._waiting]
        for slot in range(len(self._running)):
            self._sampler.free(slot)
        self._running, self._waiting = [], deque()
        self._ids.clear()
        self._n_stop_strings = 0
        return outs

    @torch.inference_mode()
    def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        """Copy ``tensors`` (HF names) in; later tokens carry ``version``. Raises
        ModelConfigError naming a missing, unexpected or misshaped tensor (weights unchanged)."""
        model = build_model(self.config, tensors, self.device, self.dtype, self._model)
        if model is not self._model:  # a new model: pack it (later loads write through)
            self._model, self._decode = model, PackedDecoder(model, self.max_seq_len)
            self._decode.record_routing(self._routing)
        self.version = version

    def release_memory(self) -> None:
        """Free the KV cache and weights. Raises EngineError while requests are in flight."""
        if self._waiting or self._running:
            raise EngineError(
                f"release_memory with {len(self._waiting) + len(self._running)} requests in "
                "flight; abort them first"
            )
        self._model = self._cache = self._decode = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @torch.inference_mode()
    def resume_memory(self) -> None:
        """Re-allocate the KV cache (weights must be loaded again)."""
        if self._cache is None:
            self._cache = serving_cache(
                self.config, self.max_batch, self.max_seq_len, self.device, self.dtype
            )

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        """Add ``requests``, step until all of them finish, return their outputs in order.
        Other requests' outputs are kept for the next ``step()``. Raises like add_request (after
        aborting those of ``requests`` already added)."""
        added: list[str] = []
        try:
            for r in requests:
                self.add_request(r)
                added.append(r.request_id)
        except (RequestError, EngineError):
            for rid in added:
                self.abort(rid)
            raise
        got: dict[str, GenerationOutput] = {}
        others: list[GenerationOutput] = []
        wanted = set(added)
        while len(got) < len(wanted):
            for out in self.step():
                if out.request_id in got or out.request_id not in wanted:
                    others.append(out)
                else:
                    got[out.request_id] = out
        self._ready.extend(others)
        return [got[r.request_id] for r in requests]

    # ---- internals -----------------------------------------------------------------------

    def _serving(self) -> tuple[PackedDecoder, ServingCache]:
        """The forward pass and KV cache; raises EngineError when released or without weights."""
        if self._cache is None:
            raise EngineError("engine memory was released; call resume_memory() and load_weights()")
        if self._decode is None:
            raise EngineError("no weights loaded; call load_weights() before serving")
        return self._decode, self._cache

    def _check(self, req: GenerationRequest) -> None:
        p, vocab, k = req.params, self.config.vocab_size, len(req.prefix_ids)
        named_ids = {"prompt_ids": req.prompt_ids, "prefix_ids": req.prefix_ids,
                     "stop_token_ids": p.stop_token_ids}  # fmt: skip
        bad = [(n, t) for n, ids in named_ids.items() for t in ids if not 0 <= t < vocab]
        bad_name, bad_id = bad[0] if bad else ("", 0)
        problems = [  # (failed, why): the first that failed is reported
            (req.request_id in self._ids, "duplicate request_id; one is already queued or running"),
            (not req.prompt_ids, "empty prompt"),
            (len(req.prompt_ids) >= self.max_seq_len,
             f"prompt of {len(req.prompt_ids)} tokens leaves no room to generate in a context of "
             f"{self.max_seq_len} tokens"),
            (bool(bad), f"{bad_name} holds token id {bad_id} outside the vocabulary 0..{vocab - 1}"),
            (p.max_tokens <= 0, f"max_tokens must be positive, got {p.max_tokens}"),
            (k > p.max_tokens, f"prefix of {k} tokens exceeds max_tokens {p.max_tokens}"),
            (len(req.prefix_logprobs) != k or len(req.prefix_versions) != k,
             f"prefix_logprobs/prefix_versions have {len(req.prefix_logprobs)}/"
             f"{len(req.prefix_versions)} entries for {k} prefix_ids"),
            (not (math.isfinite(p.temperature) and p.temperature >= 0),
             f"temperature must be finite and >= 0, got {p.temperature}"),
            (not 0 < p.top_p <= 1, f"top_p must be in (0, 1], got {p.top_p}"),
            (bool(p.stop_strings) and (self.detokenize is None or "" in p.stop_strings),
             "stop_strings need non-empty strings and an engine built with detokenize="),
        ]  # fmt: skip
        for failed, why in problems:
            if failed:
                raise RequestError(f"request {req.request_id!r}: {why}")

    def _admit(self) -> list[GenerationOutput]:
        """Move waiting requests into free slots and prefill them, shortest first, in groups
        of similar length (``prefill_groups``)."""
        outs: list[GenerationOutput] = []
        joiners: list[_Seq] = []
        start = len(self._running)
        while self._waiting and start + len(joiners) < self.max_batch:
            seq = self._waiting.popleft()
            if len(seq.request.prefix_ids) >= seq.limit:  # nothing left to generate here
                outs.append(self._prefix_output(seq, "length"))
                continue
            joiners.append(seq)
        if not joiners:
            return outs
        # a slot's sampling is a function of its request's seed and token index alone, so
        # the order joiners take slots in changes no token
        joiners.sort(key=lambda s: len(s.request.prompt_ids) + len(s.request.prefix_ids))
        for i, seq in enumerate(joiners):
            self._install(start + i, seq)
        seqs = [s.request.prompt_ids + s.request.prefix_ids for s in joiners]
        all_lengths = [len(s) for s in seqs]
        decoder, cache = self._serving()
        logits = []
        for a, b in prefill_groups(all_lengths):
            lengths = all_lengths[a:b]
            width = lengths[-1]  # (sorted)
            ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs[a:b]],
                               device=self.device)
            cache.begin_prefill(start + a, lengths)
            if self._routing is not None:
                self._routing.at_prefill(start + a, b - a, width)
            logits.append(decoder.prefill(ids, torch.tensor(lengths, device=self.device) - 1,
                                          cache))
        self._running.extend(joiners)
        return outs + self._record(start, torch.cat(logits))

    def _install(self, slot: int, seq: _Seq) -> None:
        req = seq.request
        stops = list(dict.fromkeys((*req.params.stop_token_ids, *self.eos_token_ids)))
        prefix = (req.prefix_ids, req.prefix_logprobs, req.prefix_versions)
        self._resp.install(slot, prefix, seq.limit, stops, req.params.min_tokens)
        self._sampler.set(slot, req.params, seq.key)
        self._n_stop_strings += bool(seq.window)

    def _record(self, start: int, logits: torch.Tensor) -> list[GenerationOutput]:
        """Sample for slots ``start..``, append to their responses, retire finished ones."""
        n = logits.shape[0]
        logits = self._resp.block_early_stops(start, logits)
        tokens, logprobs = self._sampler.sample(logits, start, self._resp.count[start : start + n])
        stopped, finished = self._resp.append(start, tokens, logprobs, self.version)
        hits = finished.nonzero().flatten()
        reasons: dict[int, FinishReason] = {}
        if hits.numel():
            for i, s in zip(hits.tolist(), stopped[hits].tolist(), strict=True):
                reasons[start + i] = "stop" if s else "length"
        if self._n_stop_strings:  # only then does a step do Python work per running request
            for slot in range(start, start + n):
                seq = self._running[slot]
                if seq.window and slot not in reasons and self._hit_stop_string(slot, seq):
                    reasons[slot] = "stop"
        outs = [self._slot_output(slot, reasons[slot]) for slot in sorted(reasons)]
        for slot in sorted(reasons, reverse=True):  # descending keeps the moved slots valid
            self._remove(slot)
        return outs

    def _hit_stop_string(self, slot: int, seq: _Seq) -> bool:
        tail = self._resp.tail(slot, seq.window)
        text = self.detokenize(tail) if self.detokenize else ""
        return any(s in text for s in seq.request.params.stop_strings)

    def _remove(self, slot: int) -> None:
        """Free ``slot``, moving the last running sequence into it to keep slots dense."""
        last = len(self._running) - 1
        self._ids.discard(self._running[slot].request.request_id)
        self._n_stop_strings -= bool(self._running[slot].window)
        if slot != last:
            self._serving()[1].move(last, slot)
            self._resp.move(last, slot)
            self._sampler.move(last, slot)
            if self._routing is not None:
                self._routing.move(last, slot)
            self._running[slot] = self._running[last]
        else:
            self._sampler.free(slot)
        self._running.pop()

    def _slot_output(self, slot: int, reason: FinishReason) -> GenerationOutput:
        req = self._running[slot].request
        ids, logprobs, versions = self._resp.read(slot)
        routing = b""
        if self._routing is not None:  # every position fed: all but the last token
            routing = self._routing.read(slot, len(req.prompt_ids) + len(ids) - 1)
        return GenerationOutput(
            req.request_id, list(req.prompt_ids), ids, logprobs, versions, reason, routing=routing
        )

    def _prefix_output(self, seq: _Seq, reason: FinishReason) -> GenerationOutput:
        req = seq.request
        self._ids.discard(req.request_id)
        prefix = (list(req.prefix_ids), list(req.prefix_logprobs), list(req.prefix_versions))
        return GenerationOutput(req.request_id, list(req.prompt_ids), *prefix, reason)
