"""TensorBoard event files under the run folder (``pivotflow[tensorboard]``): one scalar per
metric per step, read by ``tensorboard --logdir RUN/tensorboard``. Imported only when chosen."""

from __future__ import annotations

from pathlib import Path


class TensorBoardSink:
    def __init__(self, logdir: Path, resumed_after: int | None) -> None:
        # torch's writer (torch is loaded in the run's process anyway); it needs tensorboard
        from torch.utils.tensorboard import SummaryWriter

        # a resume writes the steps after its checkpoint again: purge_step tells TensorBoard's
        # reader to drop the earlier files' events from that step on (as metrics.jsonl moves
        # those lines to metrics.superseded.jsonl), so each step is drawn once
        purge = None if resumed_after is None else resumed_after + 1
        self.writer = SummaryWriter(str(logdir), purge_step=purge, flush_secs=10)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()  # a step is seconds apart: the curve is live, and a kill loses none

    def close(self) -> None:
        self.writer.close()
