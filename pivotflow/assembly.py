"""One way to assemble a run's machine, for ``pivotflow run`` and ``pivotflow sim`` alike.

A machine is a controller, the transport it owns, the planner it asks, and the *fleet* of
workers it runs on: worker processes a launcher starts (``launch/fleet.py``), or simulated
workers on a virtual clock (``sim/cluster.py``). ``assemble`` builds the controller from its
parts and puts what must be released (the transport, the fleet) on the caller's exit stack, so
a failure anywhere in the build or the run releases everything that was opened, in reverse
order, with no hand-written try/finally chains. ``Machine.run`` serves the controller with the
fleet's own loops and the caller's side work in one task group (``concurrency.serve_beside``):
they end with the controller, and the first error in any of them ends the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from pivotflow.concurrency import serve_beside
from pivotflow.controller.clock import Clock
from pivotflow.controller.core import Controller, ControllerConfig
from pivotflow.controller.evaluation import Evaluation
from pivotflow.controller.recovery import Respawn
from pivotflow.controller.sample import Sample
from pivotflow.controller.source import PromptSource
from pivotflow.graph import Graph
from pivotflow.planner.base import Planner
from pivotflow.tokenizer.base import Tokenizer
from pivotflow.transport.base import ControllerTransport


class Fleet(Protocol):
    """The workers a controller runs on; it owns them (their processes, or simulated state)."""

    # how the controller replaces a dead worker (new id, old id); None: it cannot
    respawn: Respawn | None

    def bind(self, ctl: Controller) -> None:
        """Told the controller it serves (where each worker reads its store, ...)."""

    def start(self) -> None:
        """Start the workers the run begins with."""

    def serving(self) -> list[Coroutine[Any, Any, None]]:
        """What runs beside the controller while it runs (a worker's loop, an exit watch)."""

    def close(self) -> None:
        """Stop every worker (idempotent)."""


@dataclass
class ControllerParts:
    """What a controller is built from, besides its graph, config, transport and clock."""

    tokenizers: dict[str, Tokenizer]
    source: PromptSource
    assignments: dict[str, str]  # worker id -> the pool it starts in
    role_options: dict[str, dict[str, Any]]  # pool -> the options its workers' roles get
    store_dir: str
    planner: Planner
    on_step: Callable[[dict[str, Any]], None] | None = None
    on_samples: Callable[[list[list[Sample]], int, int], None] | None = None
    tool_pools: dict[str, Any] = field(default_factory=dict)
    evaluation: Evaluation | None = None  # held-out rounds (eval_every)


@dataclass
class Machine:
    controller: Controller
    fleet: Fleet

    async def run(self, *beside: Coroutine[Any, Any, None]) -> None:
        """Start the fleet and run the controller to its end, the fleet's loops and
        ``beside`` in the same task group; raises the first error of any of them."""
        self.fleet.start()
        await serve_beside(self.controller.run(), *self.fleet.serving(), *beside)


def assemble(stack: contextlib.ExitStack | contextlib.AsyncExitStack, graph: Graph,
             cfg: ControllerConfig, parts: ControllerParts, *, transport: ControllerTransport,
             clock: Clock, fleet: Fleet) -> Machine:
    """The controller on ``transport`` and ``fleet``; both are closed when ``stack`` unwinds
    (the fleet first: its workers stop before the socket they talk on goes)."""
    stack.callback(transport.close)
    stack.callback(fleet.close)
    ctl = Controller(graph, cfg, transport=transport, clock=clock, tokenizers=parts.tokenizers,
                     source=parts.source, assignments=parts.assignments,
                     role_options=parts.role_options, store_dir=parts.store_dir,
                     on_step=parts.on_step, planner=parts.planner, respawn=fleet.respawn,
                     tool_pools=parts.tool_pools or None, on_samples=parts.on_samples,
                     evaluation=parts.evaluation)
    fleet.bind(ctl)
    return Machine(ctl, fleet)
