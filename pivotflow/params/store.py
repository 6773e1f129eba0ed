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

import torch

from pivotflow.errors import CheckpointError
from pivotflow.params.base import HFConfig
from pivotflow.params.hf_folder import read_folder, write_folder
from pivotflow.params.index import config_data


class DirectoryParamStore:
    """``root/<model>/v<version>/`` holds model.safetensors and the model's HF config.json (the
    published dict, as it was); ``LATEST`` names the newest whole version."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _dir(self, model: str, version: int) -> Path:
        return self.root / model / f"v{version:08d}"

    def path(self, model: str, version: int) -> Path:
        """The folder of ``model@version``: a Hugging Face-style checkpoint (vLLM and SGLang
        load it by path)."""
        return self._dir(model, version)

    def publish(self, model: str, version: int, tensors: dict[str, torch.Tensor],
                config: HFConfig) -> None:
        """Write ``model@version`` whole, then point LATEST at it (readers never see half).
        Raises CheckpointError for a config that is not a dict of JSON data."""
        data = config_data(config, f"publish {model}@v{version}")
        final = self._dir(model, version)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".v{version}-", dir=final.parent))
        try:
            write_folder(tmp, data, tensors)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
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

    def versions(self, model: str) -> list[int]:
        """Every published version of ``model``, oldest first (empty if none)."""
        return sorted(int(d.name[1:]) for d in (self.root / model).glob("v*")
                      if d.is_dir() and d.name[1:].isdigit())

    def load(self, model: str, version: int | None = None
             ) -> tuple[int, HFConfig, dict[str, torch.Tensor]]:
        """(version, config dict, tensors) of ``model@version`` (the latest when None)."""
        if version is None:
            version = self.latest(model)
        config, tensors = read_folder(self._dir(model, version))
        return version, config, tensors

    def gc(self, model: str, keep: int = 2) -> None:
        """Delete all but the ``keep`` newest versions (readers load within one step)."""
        versions = sorted((self.root / model).glob("v*"))
        for old in versions[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
