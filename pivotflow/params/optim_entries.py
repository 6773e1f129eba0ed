"""A trainer pool's AdamW state in the parameter store: whole, or one shard a trainer.

* The replicated layout (``zero_stage`` 0) has rank 0 publish the whole state with each
  version as ``<model>.optim``: one entry a weight's moment, under the weight's name
  (``worker/adam_state.adam_tensors``), and the LoRA adapters beside them.
* The sharded layout (``zero_stage`` 1) has every rank publish the chunks it owns, at the same
  version, as ``<model>.optim.r<rank>``; the shard's config carries the layout
  (``SHARD_KEY``: the weights' names and shapes, the bucket size, the group's size and epoch,
  AdamW's step count), and rank 0's shard the adapters. Why not gather it whole for one entry,
  as this layout first did: that cost rank 0 the whole state in host memory and the group a
  collective the size of the state at every step, and made rank 0 write it all alone (for a 7B
  policy with bf16 weights, 84 GB a step: float32 masters and two moments).

``load_optim_state`` returns the whole state under the replicated layout's names from either,
so a trainer that takes the pool over, a checkpoint and ``--resume`` see one format; from
shards it joins each entry as it is read (``JoinedState``). ``StoredState`` reads flat ranges
of either: a re-cut sharded group's ranks each read just their new chunks. So nobody holds or
sends the whole sharded state, a checkpoint's writer included (it streams it to its file). A state is whole only when every shard of one group's publish is there (same world and
epoch); a step's shards are all published before its weights (``train_role``), so a version
whose weights are in the store has its state too, once it has crossed to this node.

Importing this module loads no torch.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pivotflow.errors import CheckpointError
from pivotflow.params.flat_layout import FlatLayout

if TYPE_CHECKING:
    import torch

    from pivotflow.params.base import ParamStore

SHARD_KEY = "optim_shard"  # in a shard's config: its layout (see the module)
PLACEHOLDER_KEY = "optim_placeholder"  # in the config of an entry published empty to retire it
OPTIM_WAIT_S = 30.0  # for a state to reach this node's store (on a cluster it may be crossing)
_SHARD_NAME = re.compile(r".+\.optim\.r\d+")


def optim_name(model: str) -> str:
    """The whole state's entry."""
    return f"{model}.optim"


def shard_name(model: str, rank: int) -> str:
    """Rank ``rank``'s shard of the state."""
    return f"{model}.optim.r{rank}"


def shard_rank(model: str, name: str) -> int | None:
    """The rank whose shard of ``model``'s state the entry ``name`` is; None for any other."""
    rank = name.removeprefix(f"{model}.optim.r")
    return int(rank) if rank != name and rank.isdigit() else None


def is_optim(name: str) -> bool:
    """Whether a store entry is an optimizer state (whole or a shard): the store agents keep
    fewer versions of those (``node_agent.keep_for``)."""
    return name.endswith(".optim") or bool(_SHARD_NAME.fullmatch(name))


def chunk_name(key: str, bucket: int) -> str:
    """A shard's tensor: this rank's chunk of ``bucket`` of the state's ``key`` (exp_avg,
    exp_avg_sq, master). ``#`` is in no weight's name, so adapters beside them cannot clash."""
    return f"#{key}.{bucket}"


def publish_part(store: ParamStore, model: str, version: int,
                 tensors: dict[str, torch.Tensor], shard: dict[str, Any] | None,
                 config: dict[str, Any], keep: int) -> str:
    """Publish this rank's part of ``model``'s state at ``version`` (the whole state when
    ``shard`` is None, else the shard it describes), keep ``keep`` versions of it; returns the
    entry's name."""
    if shard is None:
        name = optim_name(model)
        store.publish(name, version, tensors, config)
    else:
        name = shard_name(model, shard["rank"])
        store.publish(name, version, tensors, {**config, SHARD_KEY: shard})
    store.gc(name, keep=keep)
    return name


def retire_stale(store: ParamStore, model: str, world: int, version: int,
                 keep: int) -> list[str]:
    """For rank 0 of a sharded group that published ``version``: the state entries it did not
    write (the whole entry a resume published, the shards of ranks that left the group) get an
    empty placeholder at ``version``, so the store's collection (``keep`` versions a name, on
    every node) drops what they held two publishes on, while the version before stays for a
    step redone from it. A name whose kept versions are all placeholders is left alone.
    Returns the names published. (The store never collects a name's newest version, nor can a
    name be removed from one node alone: a store agent would send it back.)"""
    names = []
    for entry in sorted(p.name for p in store.root.iterdir() if p.is_dir()):
        rank = shard_rank(model, entry)
        if entry == optim_name(model) or (rank is not None and rank >= world):
            names.append(entry)
    published = []
    for name in names:
        kept = store.versions(name)
        if not kept or kept[-1] >= version or all(_placeholder(store, name, v) for v in kept):
            continue
        store.publish(name, version, {}, {PLACEHOLDER_KEY: True})
        store.gc(name, keep=keep)
        published.append(name)
    return published


def _placeholder(store: ParamStore, name: str, version: int) -> bool:
    got = _load(store, name, version)
    return got is None or bool(got[0].get(PLACEHOLDER_KEY))


def load_optim_state(store: ParamStore, model: str, version: int,
                     wait_s: float = OPTIM_WAIT_S) -> Mapping[str, torch.Tensor]:
    """``model``'s whole state at ``version``, under the replicated layout's names: its entry
    (zero-copy views), or its shards joined one entry at a time as each is read
    (``JoinedState``); waits up to ``wait_s`` for it to be whole here. Raises CheckpointError
    (one line) when it is not."""
    held = StoredState.wait(store, model, version, wait_s)
    return held.parts[0] if held.layout is None else JoinedState(held)


def stored_extras(store: ParamStore, model: str, version: int,
                  wait_s: float = OPTIM_WAIT_S) -> dict[str, torch.Tensor]:
    """The tensors stored beside the moments at ``version`` (the LoRA adapters), among others:
    the whole entry, or rank 0's shard (views; waits as ``load_optim_state``)."""
    return StoredState.wait(store, model, version, wait_s).parts[0]


class StoredState:
    """One version of a model's state as this node's store holds it: the whole entry
    (``layout`` None, ``parts`` [it]) or every shard of one publish (``parts`` in rank order),
    zero-copy views held while this object lives; read one flat range at a time (``read``), so
    a re-cut sharded group's ranks each read just their new chunks and nobody holds or sends
    the whole state."""

    def __init__(self, layout: dict[str, Any] | None, parts: list[dict[str, torch.Tensor]],
                 where: str) -> None:
        self.layout, self.parts, self.where = layout, parts, where
        if layout is None:
            first = next((k for k in parts[0] if k.endswith(".exp_avg")), None)
            stem = first.removesuffix(".exp_avg") if first else ""
            self.keys = ("exp_avg", "exp_avg_sq") + (
                ("master",) if f"{stem}.master" in parts[0] else ())
            step = parts[0].get(f"{stem}.step")  # (``check`` says whether it is a state)
            self.steps = int(float(step)) if step is not None else 0
            self.names: list[str] = []
        else:
            self.keys = tuple(layout["keys"])
            self.steps = int(layout["steps"])
            self.names = [n for n, _ in layout["params"]]
            self.shapes = [tuple(s) for _, s in layout["params"]]
            self.flat = FlatLayout([math.prod(s) for s in self.shapes], layout["bucket_elems"])

    @classmethod
    def wait(cls, store: ParamStore, model: str, version: int,
             wait_s: float = OPTIM_WAIT_S) -> StoredState:
        """``model``'s state at ``version``, once whole here (waiting up to ``wait_s``)."""
        deadline = time.monotonic() + wait_s
        where = f"optimizer state {optim_name(model)}@v{version}"
        while True:
            found = _find(store, model, version)
            if found is not None:
                return cls(*found, where)
            if time.monotonic() >= deadline:
                raise CheckpointError(f"{where} never reached the parameter store whole "
                                      f"(waited {wait_s:g} s)")
            time.sleep(0.01)

    def check(self, names: list[str], shapes: list[tuple[int, ...]]) -> None:
        """Raise CheckpointError (one line) unless it is a state of the weights ``names`` of
        ``shapes`` (the trainable ones, in parameter order)."""
        if self.layout is None:
            check_entries(names, shapes, self.parts[0])
            self.names = names
        elif [[n, list(s)] for n, s in zip(names, shapes, strict=True)] != self.layout["params"]:
            raise CheckpointError(f"{self.where} was stored for other weights (its shards' "
                                  f"first weight {self.layout['params'][0][0]!r})")

    def read(self, key: str, flat: FlatLayout, lo: int, hi: int, out: torch.Tensor) -> None:
        """``out[: hi - lo]`` = the flat ``[lo, hi)`` of ``key`` (``flat``: the reader's
        layout of the same weights, so the same index space; after ``check``)."""
        if self.layout is None:
            whole = self.parts[0]
            for i, a, z, o in flat.pieces(lo, hi):
                out[o: o + z - a].copy_(whole[f"{self.names[i]}.{key}"].reshape(-1)[a:z])
            return
        world = self.layout["world"]
        for b, (s, e) in enumerate(self.flat.buckets):
            if e <= lo or s >= hi:
                continue
            for rank, shard in enumerate(self.parts):
                a, z = self.flat.owned(b, world, rank)
                a2, z2 = max(a, lo), min(z, hi)
                if a2 < z2:
                    out[a2 - lo: z2 - lo].copy_(shard[chunk_name(key, b)][a2 - a: z2 - a])


class JoinedState(Mapping[str, "torch.Tensor"]):
    """A sharded state under the replicated layout's names, in its order (each weight's
    ``exp_avg``, ``exp_avg_sq``, ``step`` and, for a bf16 model, ``master``), then rank 0's
    other tensors (the adapters): each entry is joined from the shards when read, so a
    checkpoint streams the state to its file without holding it whole."""

    def __init__(self, held: StoredState) -> None:
        self.held = held
        chunks = {chunk_name(k, b) for k in held.keys for b in range(len(held.flat.buckets))}
        self.extras = {k: v for k, v in held.parts[0].items() if k not in chunks}
        self.at: dict[str, tuple[int, str]] = {}  # entry -> (weight, key)
        for i, name in enumerate(held.names):
            for key in ("exp_avg", "exp_avg_sq", "step", "master"):
                if key == "step" or key in held.keys:
                    self.at[f"{name}.{key}"] = (i, key)

    def __getitem__(self, name: str) -> torch.Tensor:
        import torch

        if name in self.extras:
            return self.extras[name]
        i, key = self.at[name]
        if key == "step":
            return torch.tensor(float(self.held.steps))
        flat = self.held.flat
        out = torch.empty(math.prod(self.held.shapes[i]), dtype=torch.float32)
        self.held.read(key, flat, flat.starts[i], flat.starts[i + 1], out)
        return out.view(self.held.shapes[i])

    def spec(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
        """An entry's dtype and shape, without joining it (``safetensors_stream``)."""
        import torch

        if name in self.extras:
            return self.extras[name].dtype, tuple(self.extras[name].shape)
        i, key = self.at[name]
        return torch.float32, () if key == "step" else self.held.shapes[i]

    def __iter__(self) -> Iterator[str]:
        yield from self.at
        yield from self.extras

    def __len__(self) -> int:
        return len(self.at) + len(self.extras)


def _load(store: ParamStore, name: str, version: int) -> tuple[dict, dict] | None:
    try:  # (zero-copy views: the version stays held while they live)
        _, config, tensors = store.load(name, version)
    except CheckpointError:
        return None
    return config, tensors


def _find(store: ParamStore, model: str, version: int
          ) -> tuple[dict[str, Any] | None, list[dict[str, torch.Tensor]]] | None:
    """(the shards' layout, every shard in rank order) or (None, [the whole entry]); None while
    neither is here whole."""
    first = _load(store, shard_name(model, 0), version)
    if first is None:  # not sharded (or not here yet)
        got = _load(store, optim_name(model), version)
        if got is None or got[0].get(PLACEHOLDER_KEY):  # (a retired entry holds nothing)
            return None
        return None, [got[1]]
    layout = first[0][SHARD_KEY]
    shards = [first[1]]
    for rank in range(1, layout["world"]):
        got = _load(store, shard_name(model, rank), version)
        if got is None or not _same_publish(got[0][SHARD_KEY], layout):
            return None  # still on its way (or a group's publish half replaced: it follows)
        shards.append(got[1])
    return layout, shards


def _same_publish(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["world"] == b["world"] and a["epoch"] == b["epoch"]


def check_entries(names: list[str], shapes: list[tuple[int, ...]],
                  tensors: Mapping[str, torch.Tensor]) -> None:
    """Raise CheckpointError when a whole state lacks an entry of the weights ``names`` (of
    ``shapes``) or has one of the wrong shape (a state saved for another model)."""
    for name, shape in zip(names, shapes, strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            src = tensors.get(f"{name}.{key}")
            want = () if key == "step" else tuple(shape)
            if src is None or tuple(src.shape) != want:
                raise CheckpointError(f"optimizer state entry {f'{name}.{key}'!r} is missing or "
                                      f"has shape {None if src is None else tuple(src.shape)}, "
                                      f"not {want}")

