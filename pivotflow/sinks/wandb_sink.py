"""Weights & Biases (``pivotflow[wandb]``): a run per run segment, its files under
``RUN/wandb/``, offline unless the user has logged in (an API key in the environment or in
``~/.netrc``) or set ``WANDB_MODE`` themselves; ``wandb sync RUN/wandb/offline-run-*`` uploads
an offline one later. Imported only when chosen."""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse


def logged_in() -> bool:
    """Whether wandb has credentials here, read as wandb reads them, without a network call."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or ""
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbSink:
    def __init__(self, out: Path, config: dict[str, Any], resumed_after: int | None) -> None:
        import wandb

        # WANDB_MODE, when set, is wandb's to read (and to refuse if it is no mode)
        mode: Literal["online", "offline"] | None = (
            None if os.environ.get("WANDB_MODE") else "online" if logged_in() else "offline")
        segment = len(config.get("history") or [None])
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "pivotflow"), dir=str(out), mode=mode,
            name=out.name if segment == 1 else f"{out.name}-segment{segment}",
            group=out.name, job_type="train", config={**config, "resumed_after": resumed_after},
            # the run's own console (the live view) stays as it is: no stdout capture
            settings=wandb.Settings(console="off", silent=True))

    def write(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()
