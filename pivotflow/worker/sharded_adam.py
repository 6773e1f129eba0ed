"""AdamW with its state sharded over the trainers' group (``zero_stage`` 1, DeepSpeed's ZeRO
stage 1; ``group_adam.py`` has the interface and the replicated layout).

Why: AdamW's two moments are 8 bytes a float32 weight, twice the weights themselves, and every
trainer of the replicated layout holds them whole. Sharded, each of ``world`` trainers holds
1/world of them, and steps 1/world of the weights. A 7B policy trained in float32 needs
28 GB of weights, 28 GB of gradients and 56 GB of moments on each of 8 GPUs replicated (112 GB:
no 80 GB GPU holds it), 63 GB sharded. With the model held in bf16 (``train_dtype``) each rank
also keeps float32 master weights of its chunk, and the model is 2 bytes a weight, its
gradients too: 39 GB (DeepSpeed's bf16 ZeRO stage 1).

The layout: the trainable weights, in parameter order, are one flat index space cut into
buckets of at most ``BUCKET_ELEMS`` (so no collective needs a buffer the size of the model);
each bucket is padded to a multiple of ``world`` and rank ``r`` owns its ``r``-th chunk. A step
reduce-scatters each bucket's gradient (each rank receives the summed gradient of its chunk),
clips by the norm over every chunk (one all-reduced scalar), steps AdamW on the chunk of the
weights it owns, in place (``torch.optim.adamw.adamw``, AdamW's own arithmetic, on views of
the weights, their gradients and this rank's moments: no copy of the weights or gradients is
kept), and all-gathers the stepped chunks back into every rank's weights. With a
reduce-scatter as fast as half an all-reduce (NCCL's) that is the replicated layout's traffic;
gloo's is slower than its all-reduce, so over gloo the bucket is all-reduced and each rank
keeps its chunk, and the all-gather is the traffic added (``bench/zero_optimizer.py``). It is
the same step: AdamW is elementwise, so cutting the weights changes no value (the norm's
summation order aside).

The state has no home of its own between groups: with every version each rank publishes the
chunks it owns to the parameter store (``<model>.optim.r<rank>``, ``params/optim_entries.py``),
which joins them into the replicated layout's ``<model>.optim`` for whoever needs it whole.
When the group changes (a trainer joins or leaves, or rank 0 takes the pool over), each rank
reads its new chunks straight from the store's copy at the version rank 0 took over or holds,
whatever layout stored it (``optim_entries.StoredState``): nobody holds or sends the whole
state. Only a rank that held every chunk and stays alone keeps them as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.adamw import adamw

from pivotflow.params.flat_layout import FlatLayout
from pivotflow.params.optim_entries import StoredState, chunk_name
from pivotflow.worker.group_adam import BETAS, StatePart, StoreCopy
from pivotflow.worker.train_group import TrainGroup

BUCKET_ELEMS = 1 << 24  # 16 Mi elements: 64 MiB a float32 collective buffer
# (torch 2.13's names; the older ones warn there, and are all an older torch has)
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
MOMENTS = ("exp_avg", "exp_avg_sq")
STATE_DTYPE = torch.float32  # the moments', and a bf16 model's master weights'


class ShardedAdamW:
    """This rank's chunks of AdamW's moments; see the module for the layout."""

    def __init__(self, model: torch.nn.Module, lr: float, bucket_elems: int = 0) -> None:
        bucket_elems = bucket_elems or BUCKET_ELEMS  # (read here: a test cuts finer)
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in self.named]
        self.lr = lr
        self.bucket_elems = bucket_elems
        self.flat = FlatLayout([p.numel() for p in self.params], bucket_elems)
        self.buckets = self.flat.buckets
        self.layout: tuple[int, int, int] | None = None  # (epoch, world, rank) it is cut for
        self.world, self.rank = 1, 0
        # A model held in bf16 (train_dtype) keeps float32 master weights of the chunks this
        # rank owns: AdamW steps them and the model takes them rounded, so updates smaller than
        # a bf16 weight's spacing add up instead of vanishing (DeepSpeed's bf16 ZeRO). They
        # travel in <model>.optim as "<weight>.master".
        self.keeps_master = any(p.dtype != STATE_DTYPE for p in self.params)
        self.keys = MOMENTS + (("master",) if self.keeps_master else ())
        # this rank's chunk of each bucket, per key (a bucket's padding past its end too)
        self.chunks: dict[str, list[torch.Tensor]] = {key: [] for key in self.keys}
        self.steps = 0  # AdamW's step count, the same for every weight
        # one bucket's collective buffer and one chunk's, kept: a fresh 64 MiB a bucket a step
        # cost more in page faults than the collectives themselves (on CPU)
        self.scratch = torch.zeros(0)
        self.send = torch.zeros(0)
        self.pending: StoreCopy | None = None  # where a taken-over state is, rank 0

    # -- the layout ----------------------------------------------------------------------

    def _chunk(self, bucket: int) -> int:
        return self.flat.chunk(bucket, self.world)

    def _owned(self, bucket: int) -> tuple[int, int]:
        """The flat range this rank owns of ``bucket`` (empty past the bucket's end)."""
        return self.flat.owned(bucket, self.world, self.rank)

    def _pieces(self, lo: int, hi: int) -> list[tuple[int, int, int, int]]:
        return self.flat.pieces(lo, hi)

    def _read(self, tensors: Sequence[torch.Tensor], lo: int, hi: int, out: torch.Tensor) -> None:
        """``out[: hi - lo]`` = the flat ``[lo, hi)`` of ``tensors`` (one a weight); the rest
        of ``out`` zeros."""
        out.zero_()
        for i, a, b, o in self._pieces(lo, hi):
            out[o: o + b - a].copy_(tensors[i].detach().reshape(-1)[a:b])

    def _write(self, buf: torch.Tensor, lo: int, hi: int,
               tensors: Sequence[torch.Tensor]) -> None:
        """The flat ``[lo, hi)`` of ``tensors`` = ``buf[: hi - lo]``."""
        for i, a, b, o in self._pieces(lo, hi):
            tensors[i].detach().view(-1)[a:b].copy_(buf[o: o + b - a])

    def _new_buffer(self, n: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        p = self.params[0]
        return torch.zeros(n, dtype=dtype or p.dtype, device=p.device)

    def _bucket_buffer(self, bucket: int) -> torch.Tensor:
        """A scratch buffer in the weights' dtype, as long as ``bucket`` padded to ``world``
        chunks."""
        return self.scratch[: self._chunk(bucket) * self.world]

    def _cut(self, world: int, rank: int) -> None:
        """Fresh chunks of the state for ``rank`` of ``world``: zeroed moments, and master
        weights from the weights as they are."""
        self.world, self.rank = world, rank
        sizes = [self._chunk(b) for b in range(len(self.buckets))]
        self.chunks = {key: [self._new_buffer(c, STATE_DTYPE) for c in sizes]
                       for key in self.keys}
        for b, master in enumerate(self.chunks.get("master", [])):
            self._read(self.params, *self._owned(b), master)
        self.steps = 0
        self.scratch = self._new_buffer(max(sizes, default=0) * world if world > 1 else 0)
        self.send = self._new_buffer(max(sizes, default=0) if world > 1 else 0)

    # -- the interface (group_adam.py) ---------------------------------------------------

    def set_lr(self, lr: float) -> None:
        self.lr = lr

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self, group: TrainGroup, max_grad_norm: float) -> float:
        assert self.layout is not None, "regroup before the first step"
        for p in self.params:  # (a weight the loss never reached: a zero gradient, as DDP)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self.params if p.grad is not None]
        sq = torch.zeros(1, dtype=torch.float64)
        with torch.no_grad():
            # 1. this rank's chunk of each bucket's summed gradient, written over its own
            # gradient there (the rest of the gradient is never read again)
            for b, (s, e) in enumerate(self.buckets):
                lo, hi = self._owned(b)
                if self.world > 1:
                    full = self._bucket_buffer(b)
                    self._read(grads, s, e, full)
                    c = self._chunk(b)
                    if dist.get_backend() == "gloo":
                        # gloo's reduce-scatter took 2x its all-reduce of the same bucket (64
                        # MiB on loopback, 2 ranks: 0.104 s against 0.053 s), so sum the whole
                        # bucket and keep this rank's chunk
                        dist.all_reduce(full)
                        mine = full[self.rank * c: (self.rank + 1) * c]
                    else:
                        mine = self.send[:c]
                        _reduce_scatter(mine, full)
                    self._write(mine, lo, hi, grads)
                for i, a, z, _ in self._pieces(lo, hi):
                    sq += grads[i].view(-1)[a:z].double().pow(2).sum()
            group.all_reduce_sum([sq])
            norm = float(sq.sqrt())
            coef = min(max_grad_norm / (norm + 1e-6), 1.0)  # (clip_grad_norm_'s)
            # 2. AdamW on the chunks this rank owns
            if self.keeps_master:
                self._step_masters(grads, coef)
            else:  # in place in the weights
                ps, gs, ms, vs = [], [], [], []
                for b in range(len(self.buckets)):
                    for i, a, z, o in self._pieces(*self._owned(b)):
                        ps.append(self.params[i].detach().view(-1)[a:z])
                        gs.append(grads[i].view(-1)[a:z].mul_(coef))
                        ms.append(self.chunks["exp_avg"][b][o: o + z - a])
                        vs.append(self.chunks["exp_avg_sq"][b][o: o + z - a])
                self._adamw(ps, gs, ms, vs)
            self.steps += 1
            self.zero_grad()
            # 3. every rank's stepped chunks into every rank's weights
            if self.world > 1:
                for b, (s, e) in enumerate(self.buckets):
                    c = self._chunk(b)
                    lo, hi = self._owned(b)
                    self._read(self.params, lo, hi, self.send[:c])
                    full = self._bucket_buffer(b)
                    _all_gather(full, self.send[:c])
                    self._write(full, s, e, self.params)
        return norm

    def _adamw(self, ps: list[torch.Tensor], gs: list[torch.Tensor], ms: list[torch.Tensor],
               vs: list[torch.Tensor]) -> None:
        """AdamW's own arithmetic (torch's, as ``torch.optim.AdamW`` runs it) on views."""
        steps = [torch.tensor(float(self.steps)) for _ in ps]  # (adamw counts each up)
        adamw(ps, gs, ms, vs, [], steps, amsgrad=False, beta1=BETAS[0], beta2=BETAS[1],
              lr=self.lr, weight_decay=0.0, eps=1e-8, maximize=False)

    def _step_masters(self, grads: list[torch.Tensor], coef: float) -> None:
        """Step each owned chunk's float32 master weights on its gradient in float32, then
        round them into the model's weights."""
        g32 = self._new_buffer(max((self._chunk(b) for b in range(len(self.buckets))),
                                   default=0), STATE_DTYPE)
        for b in range(len(self.buckets)):
            lo, hi = self._owned(b)
            g = g32[: self._chunk(b)]
            self._read(grads, lo, hi, g)
            g.mul_(coef)
            master = self.chunks["master"][b]
            self._adamw([master], [g], [self.chunks["exp_avg"][b]], [self.chunks["exp_avg_sq"][b]])
            self._write(master, lo, hi, self.params)

    def state_part(self, group: TrainGroup) -> StatePart:
        """This rank's chunks, as they are (the store copies them): no collective."""
        assert self.layout is not None, "regroup before publishing"
        tensors = {chunk_name(key, b): chunk for key in self.keys
                   for b, chunk in enumerate(self.chunks[key])}
        shard: dict[str, Any] = {
            "world": self.world, "rank": self.rank, "epoch": self.layout[0],
            "steps": self.steps, "bucket_elems": self.bucket_elems, "keys": list(self.keys),
            "params": [[n, list(p.shape)] for n, p in self.named]}
        return StatePart(tensors, shard)

    def take_over(self, copy: StoreCopy) -> None:
        self.pending = copy  # (read at the regroup, each rank its chunks)

    def regroup(self, group: TrainGroup, formed: bool, stored: StoreCopy) -> None:
        key = (group.epoch, group.world, group.rank)
        if key == self.layout and self.pending is None:
            return
        # rank 0 says where the state comes from, and every rank learns it: its own chunks
        # when it held them all and stays alone, else the store's copy at the version rank 0
        # took over or holds (0: no step taken yet, so zeros), from which each rank reads just
        # its new chunks (nobody holds or sends the whole state)
        own = (self.pending is None and group.world == 1 and self.layout is not None
               and self.world == 1)
        copy = self.pending or stored
        head = torch.tensor([float(own), float(copy.version)], dtype=torch.float64)
        group.broadcast([head])
        self.pending = None
        if head[0].item():  # (alone before and after: one chunk a bucket, the bucket whole)
            self.layout = key
            return
        self._cut(group.world, group.rank)
        version = int(head[1].item())
        if version == 0:
            self.layout = key
            return  # no step taken yet: zeros, as AdamW's first step would make them
        assert stored.store is not None
        held = StoredState.wait(stored.store, stored.model, version)
        held.check([n for n, _ in self.named], [tuple(p.shape) for _, p in self.named])
        self.steps = held.steps
        # (a state without master weights, from a float32 model's run: _cut took them from
        # the weights)
        for key_name in (k for k in self.keys if k in held.keys):
            for b, chunk in enumerate(self.chunks[key_name]):
                lo, hi = self._owned(b)
                chunk.zero_()
                held.read(key_name, self.flat, lo, hi, chunk)
        self.layout = key  # (only now: a state that failed to load is read again next time)

    def state_bytes(self) -> int:
        """What this rank holds of AdamW's state: its chunks of the moments (and of the master
        weights, for a bf16 model)."""
        return sum(t.numel() * t.element_size() for chunks in self.chunks.values()
                   for t in chunks)
