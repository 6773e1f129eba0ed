"""Loading graph files and validating graphs before any process starts."""

from __future__ import annotations

import graphlib
import importlib.util
import traceback
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pivotflow.errors import GraphError
from pivotflow.graph import CRITIC_TRAIN_READS, Graph, Node

if TYPE_CHECKING:
    import networkx as nx

MODEL_KINDS = ("generate", "judge", "reference", "reward_model", "critic", "train")


def import_graph_file(path: str | Path) -> ModuleType:
    """Import a graph file as a module; raises GraphError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise GraphError(f"graph file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"pivotflow_graph_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise GraphError(f"graph file {path} cannot be imported (not a .py file?)")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise GraphError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from exc
    except GraphError:
        raise
    except Exception as exc:
        raise GraphError(f"{_where_in(path, exc)}: {type(exc).__name__}: {exc}") from exc
    module.__pivotflow_path__ = path  # type: ignore[attr-defined]
    return module


def graph_defaults(module: ModuleType) -> dict[str, Any]:
    """The graph file's knobs (its ``DEFAULTS`` dict; ``--set graph.KEY=V`` changes them)."""
    defaults = getattr(module, "DEFAULTS", {})
    if not isinstance(defaults, dict):
        raise GraphError(f"{module.__pivotflow_path__}: DEFAULTS must be a dict, "
                         f"got {type(defaults).__name__}")
    return dict(defaults)


def build_graph(module: ModuleType, knobs: dict[str, Any] | None = None) -> Graph:
    """The validated graph of an imported graph file, built with ``knobs``."""
    path: Path = module.__pivotflow_path__
    graph = getattr(module, "graph", None)
    build = getattr(module, "build", None)
    if graph is None and callable(build):
        try:
            graph = build({**graph_defaults(module), **(knobs or {})})
        except GraphError:
            raise
        except Exception as exc:
            raise GraphError(f"{_where_in(path, exc)}: build() raised "
                             f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(graph, Graph):
        raise GraphError(f"graph file {path} defines neither `graph = Graph(...)` nor "
                         f"`def build(config) -> Graph` (got {type(graph).__name__})")
    validate(graph)
    return graph


def load_graph(path: str | Path, knobs: dict[str, Any] | None = None) -> Graph:
    """Import a graph file and return its validated graph."""
    return build_graph(import_graph_file(path), knobs)


def _where_in(path: Path, exc: BaseException) -> str:
    """file:line of the deepest frame of ``exc`` inside the graph file."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == path.resolve():
            line = frame.lineno
    return f"{path}:{line}" if line else str(path)


def to_networkx(graph: Graph) -> nx.DiGraph:
    import networkx as nx  # here, not at the top: see _check_cycles

    g = nx.DiGraph()
    for node in graph.nodes.values():
        g.add_node(node.name, kind=node.kind)
    for a, b, loop in graph.edges:
        g.add_edge(a, b, loop=loop)
    return g


def validate(graph: Graph) -> None:
    """Check a graph; raise GraphError naming the node and its file line on the first problem."""
    nodes = graph.nodes
    if not nodes:
        raise GraphError(f"graph {graph.name!r} ({graph.where}) has no nodes")
    # Distinct neighbours, as a DiGraph counts them: an edge connected twice is one edge.
    preds: dict[str, set[str]] = {name: set() for name in nodes}
    succs: dict[str, set[str]] = {name: set() for name in nodes}
    for a, b, _ in graph.edges:
        succs.setdefault(a, set()).add(b)
        preds.setdefault(b, set()).add(a)
    _check_cycles(graph, preds)
    _check_resources(graph)
    sources = [n for n in nodes.values() if n.kind == "source"]
    trains = [n for n in nodes.values() if n.kind == "train"]
    if len(sources) != 1:
        raise GraphError(f"graph {graph.name!r} ({graph.where}) needs exactly one source node, "
                         f"has {len(sources)}: {sources}")
    if len(trains) != 1:
        raise GraphError(f"graph {graph.name!r} ({graph.where}) needs exactly one train node, "
                         f"has {len(trains)}: {trains}")
    for node in nodes.values():
        ins, outs = len(preds[node.name]), len(succs[node.name])
        if node.kind != "source" and ins == 0:
            raise GraphError(f"node {node.name!r} at {node.where} is dangling: nothing flows "
                             "into it (connect it, or remove it)")
        if node.kind != "train" and outs == 0:
            raise GraphError(f"node {node.name!r} at {node.where} is dangling: its output goes "
                             "nowhere (connect it to a downstream node)")
        if ins > 1 or outs > 1:
            raise GraphError(f"node {node.name!r} at {node.where} has {ins} inputs and {outs} "
                             "outputs; samples stream along one path, so each node has at most "
                             "one of each")
    # No "source inside a cycle" check here: _check_cycles has refused every cycle already.
    critic = _check_critic(graph, trains[0])
    _check_fields(graph, linear_order(graph), critic)


def _check_critic(graph: Graph, train: Node) -> Node | None:
    """At most one critic stage, on a model of its own (the trainer steps the policy and the
    critic as two models; one model cannot be both)."""
    critics = [n for n in graph.nodes.values() if n.kind == "critic"]
    if len(critics) > 1:
        raise GraphError(f"critic {critics[1].name!r} at {critics[1].where}: a graph has at "
                         f"most one critic stage ({critics[0].name!r} at {critics[0].where} "
                         "is the other)")
    if not critics:
        return None
    critic = critics[0]
    if critic.model == train.model:
        raise GraphError(f"critic {critic.name!r} at {critic.where}: its model {critic.model!r} "
                         f"is the policy train {train.name!r} trains; declare the critic as a "
                         "model of its own (g.model(\"critic\", source=...), the same folder "
                         "may serve both)")
    other = next((n for n in graph.nodes.values()
                  if n.model == critic.model and n is not critic and n is not train), None)
    if other is not None:
        raise GraphError(f"critic {critic.name!r} at {critic.where}: its model {critic.model!r} "
                         f"is also the model of {other.kind} {other.name!r} (at {other.where}); "
                         "the run turns it into a value model, so give the critic a model of "
                         "its own")
    return critic


def _check_cycles(graph: Graph, preds: dict[str, set[str]]) -> None:
    # networkx takes ~0.6 s to import, more than `pivotflow inspect` may spend in all: graphlib
    # (stdlib) decides whether there is a cycle, and only the report of one imports networkx,
    # which names it as it always has (its first simple cycle).
    try:
        graphlib.TopologicalSorter(preds).prepare()
        return
    except graphlib.CycleError:
        pass
    import networkx as nx

    g = to_networkx(graph)
    for cycle in nx.simple_cycles(g):
        pairs = list(zip(cycle, cycle[1:] + cycle[:1], strict=False))
        if not any(g.edges[a, b]["loop"] for a, b in pairs):
            first = graph.nodes[cycle[0]]
            raise GraphError(f"cycle {' -> '.join(cycle + cycle[:1])} (node {first.name!r} at "
                             f"{first.where}) is not declared; pass loop=True to connect() "
                             "if it is intended")
        raise GraphError(f"declared loop {' -> '.join(cycle + cycle[:1])}: loops are run inside "
                         "a stage (multi-turn rollout), not as graph edges, in this version")


def _check_resources(graph: Graph) -> None:
    for node in graph.nodes.values():
        if node.kind not in MODEL_KINDS:
            continue
        if node.model not in graph.models:
            raise GraphError(f"node {node.name!r} at {node.where} uses model {node.model!r}, "
                             f"which is not declared (declared: {sorted(graph.models)})")
        if node.pool not in graph.pools:
            raise GraphError(f"node {node.name!r} at {node.where} uses pool {node.pool!r}, "
                             f"which is not declared (declared: {sorted(graph.pools)})")
    used = {n.pool for n in graph.nodes.values() if n.pool}
    for pool in graph.pools.values():
        if pool.name not in used:
            raise GraphError(f"pool {pool.name!r} at {pool.where} is used by no node")


def linear_order(graph: Graph) -> list[str]:
    """Node names from the source to the train node (raises GraphError if not one path)."""
    src = next((n for n in graph.nodes.values() if n.kind == "source"), None)
    if src is None:
        raise GraphError(f"graph {graph.name!r} ({graph.where}) has no source node")
    nxt = {a: b for a, b, _ in graph.edges}
    order, cur = [src.name], src.name
    while cur in nxt and nxt[cur] not in order:
        cur = nxt[cur]
        order.append(cur)
    missing = set(graph.nodes) - set(order)
    if missing:
        node = graph.nodes[sorted(missing)[0]]
        raise GraphError(f"node {node.name!r} at {node.where} is not on the path from source "
                         f"{src.name!r} to the train node")
    return order


def _check_fields(graph: Graph, order: list[str], critic: Node | None = None) -> None:
    have: set[str] = set()
    for name in order:
        node: Node = graph.nodes[name]
        missing = node.reads - have
        if critic is not None and node.kind == "train" and CRITIC_TRAIN_READS - have:
            raise GraphError(
                f"train {node.name!r} at {node.where} trains the model of critic "
                f"{critic.name!r} and needs {sorted(CRITIC_TRAIN_READS - have)} upstream of "
                "it: put g.map(\"gae\", pivotflow.rl.group_fns.gae_advantage(), "
                "writes=[\"advantage\", \"returns\"]) after the critic")
        if missing:
            raise GraphError(
                f"node {node.name!r} at {node.where} reads {sorted(missing)}, which no upstream "
                f"node produces (available: {sorted(have)})"
            )
        have |= node.writes
