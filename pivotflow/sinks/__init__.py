"""Where a run's step metrics go besides ``metrics.jsonl`` (always written): TensorBoard event
files and Weights & Biases runs (``--set sinks=tensorboard,wandb``), each an optional extra
imported only when chosen; and the per-step sample log and the live Prometheus endpoint, which
need nothing installed. Importing this package loads none of the extras (nor torch)."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any, Protocol

from pivotflow.errors import ConfigError

log = logging.getLogger("pivotflow.sinks")

# sink name -> (the module its writer needs, the pivotflow extra that installs it)
SINKS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}


def sink_names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def check_sinks(text: str) -> list[str]:
    """The sink names ``--set sinks=`` gives; a ConfigError for an unknown one, one given twice
    or one whose extra is not installed (said before the run starts, not after a step)."""
    names = sink_names(text)
    for name in names:
        if name not in SINKS:
            raise ConfigError(f"--set sinks={text}: unknown sink {name!r}; valid: "
                              f"{', '.join(SINKS)} (metrics.jsonl is always written)")
        if names.count(name) > 1:
            raise ConfigError(f"--set sinks={text}: {name!r} is given twice")
        module, extra = SINKS[name]
        if _missing(module):
            raise ConfigError(f"--set sinks={text}: {module} is not installed "
                              f"(pip install 'pivotflow[{extra}]')")
    return names


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ValueError:  # in sys.modules without a spec (None: its import is blocked)
        return True


class Sink(Protocol):
    def write(self, step: int, scalars: dict[str, float]) -> None: ...
    def close(self) -> None: ...


def flat_scalars(record: dict[str, Any]) -> dict[str, float]:
    """A metrics.jsonl line's numbers as ``name`` or ``name/KEY`` (pools, queue depths, any
    other dict of numbers one level down); lists (group ids, shift events) and nulls left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "step":
            continue
        if isinstance(value, dict):
            out.update({f"{key}/{k}": float(v) for k, v in value.items() if _number(v)})
        elif _number(value):
            out[key] = float(value)
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and value == value  # NaN left out


class StepSinks:
    """The chosen sinks, fed each step's metrics line. A sink that fails to write (a full disk,
    a lost connection) is closed and dropped with one warning: it must not stop training, and
    metrics.jsonl still holds every step."""

    def __init__(self, sinks: dict[str, Sink]) -> None:
        self.sinks = sinks

    def write(self, record: dict[str, Any]) -> None:
        scalars = flat_scalars(record)
        for name, sink in list(self.sinks.items()):
            try:
                sink.write(int(record["step"]), scalars)
            except Exception as exc:  # noqa: BLE001 - a third-party writer's error, any kind
                log.warning("metric sink %s failed and is dropped: %s", name, exc)
                self._drop(name)

    def close(self) -> None:
        for name in list(self.sinks):
            self._drop(name)

    def _drop(self, name: str) -> None:
        sink = self.sinks.pop(name)
        try:
            sink.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("metric sink %s did not close cleanly: %s", name, exc)


def open_sinks(text: str, out: Path, config: dict[str, Any],
               resumed_after: int | None) -> StepSinks:
    """Open the sinks ``--set sinks=`` names, writing under the run folder ``out``.
    ``resumed_after``: the checkpoint's step when resuming (later steps are written again)."""
    sinks: dict[str, Sink] = {}
    try:
        for name in check_sinks(text):
            if name == "tensorboard":
                from pivotflow.sinks.tensorboard_sink import TensorBoardSink

                sinks[name] = TensorBoardSink(out / "tensorboard", resumed_after)
            else:
                from pivotflow.sinks.wandb_sink import WandbSink

                sinks[name] = WandbSink(out, config, resumed_after)
    except BaseException:
        StepSinks(sinks).close()
        raise
    return StepSinks(sinks)
