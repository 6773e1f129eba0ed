"""The streamed safetensors writer (``params/safetensors_stream.py``): safetensors itself reads
what it writes, for every dtype a model or its optimizer state holds, and it holds one tensor at
a time (a sharded optimizer state is joined entry by entry as it is written)."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from pivotflow.params.safetensors_stream import save_streamed

pytestmark = pytest.mark.timeout(60)


def test_safetensors_reads_every_dtype_and_shape_it_writes(tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float32).view(4, 6)
    tensors = {
        "f32": torch.randn(3, 5),
        "bf16": torch.randn(7).bfloat16(),  # (2 bytes: the header pads the data's alignment)
        "f16": torch.randn(2, 2).half(),
        "i64": torch.arange(5),
        "i32": torch.arange(3, dtype=torch.int32),
        "u8": torch.arange(9, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.0),  # an AdamW step count
        "empty": torch.zeros(0, 4),
        "view": base.t(),  # not contiguous
        "tied": base,  # shares storage with "view": written as its own bytes
    }
    path = tmp_path / "t.safetensors"
    save_streamed(tensors, path, metadata={"format": "pt"})
    back = load_file(path)
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"format": "pt"}
    header = int.from_bytes(path.read_bytes()[:8], "little")
    assert header % 8 == 0  # the data starts 8-byte aligned, as safetensors writes it


class Produced(Mapping[str, torch.Tensor]):
    """Tensors made when read, counting how many are alive at once (a JoinedState's kind)."""

    def __init__(self, n: int) -> None:
        self.n, self.alive, self.most = n, 0, 0

    def spec(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
        return torch.float32, (1000,)

    def __getitem__(self, name: str) -> torch.Tensor:
        t = torch.full((1000,), float(int(name)))
        self.alive += 1
        self.most = max(self.most, self.alive)
        weakref.finalize(t, self._gone)
        return t

    def _gone(self) -> None:
        self.alive -= 1

    def __iter__(self) -> Iterator[str]:
        return iter(str(i) for i in range(self.n))

    def __len__(self) -> int:
        return self.n


def test_it_holds_one_tensor_at_a_time(tmp_path: Path) -> None:
    made = Produced(50)
    save_streamed(made, tmp_path / "s.safetensors")
    assert made.most == 1  # (safetensors' save_file would hold all 50 as bytes at once)
    back = load_file(tmp_path / "s.safetensors")
    assert [float(back[str(i)][0]) for i in range(50)] == [float(i) for i in range(50)]


def test_a_tensor_unlike_its_spec_or_of_an_unnamed_dtype_is_refused(tmp_path: Path) -> None:
    class Lying(Produced):
        def spec(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
            return torch.float32, (999,)

    with pytest.raises(ValueError, match=r"^'0' read as torch.float32 \(1000,\), not as its "
                                         r"spec F32 \(999,\)$"):
        save_streamed(Lying(2), tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match=r"^'c': dtype torch.complex64 has no safetensors name$"):
        save_streamed({"c": torch.zeros(2, dtype=torch.complex64)}, tmp_path / "y.safetensors")
