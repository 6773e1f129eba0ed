"""The live view of a run (rich): step, reward, accuracy, response lengths, the policy's entropy
and clipped share, pools, queue depths, throughput."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


class LiveView:
    """A progress bar over optimizer steps and a table of the flow; a plain line per step when
    the console is not a terminal (CI logs)."""

    def __init__(self, name: str, steps: int, *, console: Console | None = None,
                 enabled: bool = True) -> None:
        self.console = console if isinstance(console, Console) else Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal
        self.quiet = console is False
        self.progress = Progress(TextColumn(f"[bold]{name}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console)
        self.task = self.progress.add_task("steps", total=steps)
        self.last: dict[str, Any] = {}
        self.flow: dict[str, Any] = {}
        self.eval: dict[str, Any] = {}  # the last evaluation round's record
        self.started = time.perf_counter()
        self._live: Live | None = None

    def __enter__(self) -> LiveView:
        if self.enabled:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4,
                              transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(*exc)

    def update_step(self, record: dict[str, Any]) -> None:
        self.last = record
        self.progress.update(self.task, completed=record["step"])
        if self._live is not None:
            self._live.update(self._render())
        elif not self.quiet:
            self.console.print(self._line(record), highlight=False)

    def update_eval(self, record: dict[str, Any]) -> None:
        """An evaluation round's result (shown until the next one)."""
        self.eval = record
        if self._live is not None:
            self._live.update(self._render())
        elif not self.quiet:
            self.console.print(f"eval  step {record['step']:>4}  accuracy "
                               f"{self._fmt(record.get('task_accuracy'))}  reward "
                               f"{self._fmt(record.get('reward_mean'))}  prompts "
                               f"{record['prompts']}", highlight=False)

    def update_flow(self, ctl: Any) -> None:
        self.flow = {
            "pools": {p.name: len(p.workers) for p in ctl.pools.values()},
            "queues": {e.name: len(e) for e in ctl.edges.values()},
            "in_flight": len(ctl.jobs),
            "tokens": ctl.tokens_generated,
        }
        if self._live is not None:
            self._live.update(self._render())

    @staticmethod
    def _fmt(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    def _line(self, r: dict[str, Any]) -> str:
        return (f"step {r['step']:>4}  reward {self._fmt(r['reward_mean'])}  "
                f"acc {self._fmt(r['task_accuracy'])}  samples {r['samples']}  "
                f"t {r['time_s']:.1f}s  tokens {r['tokens_generated']}")

    def _render(self) -> Group:
        table = Table(show_header=False, box=None, pad_edge=False)
        r = self.last
        elapsed = time.perf_counter() - self.started
        tokens = self.flow.get("tokens", r.get("tokens_generated", 0))
        table.add_row("reward", self._fmt(r.get("reward_mean")),
                      "accuracy", self._fmt(r.get("task_accuracy")))
        if r.get("response_len_max") is not None:  # (records of runs before 12-05 lack it)
            table.add_row("response", f"mean {r['response_len_mean']:.0f}  max "
                          f"{r['response_len_max']}", "cut at limit",
                          self._fmt(r.get("response_clip_ratio")))
        if self.eval:
            table.add_row("eval", f"step {self.eval['step']}", "accuracy",
                          self._fmt(self.eval.get("task_accuracy")))
        if r.get("train_entropy") is not None:  # (a step that trained)
            table.add_row("entropy", self._fmt(r["train_entropy"]), "clipped",
                          self._fmt(r.get("train_clip_frac")))
        for key, label in (("field_means", "fields"), ("logged_metrics", "logged")):
            if r.get(key):  # the graph's own fields (each TRL reward function's), log_metric's
                table.add_row(label, "  ".join(f"{k} {self._fmt(v)}" for k, v in r[key].items()))
        if r.get("stage_calls_waiting"):  # async def stages: calls out, and their median time
            p50 = r.get("stage_call_ms_p50") or {}
            table.add_row("calls", "  ".join(
                f"{k}={n} ({self._fmt(p50.get(k))} ms)" for k, n in
                r["stage_calls_waiting"].items()))
        table.add_row("pools", " ".join(f"{k}={v}" for k, v in self.flow.get("pools", {}).items()),
                      "in flight", str(self.flow.get("in_flight", 0)))
        table.add_row("queues",
                      " ".join(f"{k}={v}" for k, v in self.flow.get("queues", {}).items()),
                      "tokens/s", f"{tokens / elapsed:.0f}" if elapsed > 0 else "-")
        return Group(self.progress, table)
