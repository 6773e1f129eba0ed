"""A versioned parameter store on a local directory (safetensors + an atomic LATEST pointer).

The interface (publish / latest / load / gc) is the one the shared-memory Global Parameter
Storage keeps; this backend is what the end-to-end loop needs before it: weights never cross
the controller's socket, every version is written whole before it becomes visible.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import msgspec
import torch
from safetensors.torch import load_file, save_file

from pivotflow.engines.torch.model import ModelConfig
from pivotflow.errors import CheckpointError


class DirectoryParamStore:
    """``root/<model>/v<version>/`` holds model.safetensors and config.json; ``LATEST`` names
    the newest whole version."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _dir(self, model: str, version: int) -> Path:
        return self.root / model / f"v{version:08d}"

    def publish(self, model: str, version: int, tensors: dict[str, torch.Tensor],
                config: ModelConfig) -> None:
        """Write ``model@version`` whole, then point LATEST at it (readers never see half)."""
        final = self._dir(model, version)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".v{version}-", dir=final.parent))
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                  str(tmp / "model.safetensors"))
        (tmp / "config.json").write_bytes(msgspec.json.encode(config))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        pointer = final.parent / "LATEST"
        tmp_ptr = final.parent / f".LATEST.{os.getpid()}"
        tmp_ptr.write_text(str(version))
        os.replace(tmp_ptr, pointer)

    def latest(self, model: str) -> int:
        """The newest published version of ``model``; raises CheckpointError if none."""
        pointer = self.root / model / "LATEST"
        try:
            return int(pointer.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"parameter store {self.root}: no version of {model!r} "
                                  f"({pointer}: {exc})") from exc

    def load(self, model: str, version: int | None = None
             ) -> tuple[int, ModelConfig, dict[str, torch.Tensor]]:
        """(version, config, tensors) of ``model@version`` (the latest when None)."""
        if version is None:
            version = self.latest(model)
        d = self._dir(model, version)
        try:
            config = msgspec.json.decode((d / "config.json").read_bytes(), type=ModelConfig)
            tensors = load_file(str(d / "model.safetensors"))
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise CheckpointError(f"parameter store: {model}@v{version} at {d} is unreadable: "
                                  f"{exc}") from exc
        return version, config, tensors

    def gc(self, model: str, keep: int = 2) -> None:
        """Delete all but the ``keep`` newest versions (readers load within one step)."""
        versions = sorted((self.root / model).glob("v*"))
        for old in versions[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
