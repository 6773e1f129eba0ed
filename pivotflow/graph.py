"""Graphs: RL written as a dataflow of stages that samples stream through.

A graph file builds a :class:`Graph` and exposes it as ``graph = ...`` or ``def build(config)``::

    g = Graph("grpo_genrm")
    g.model("policy", source="builtin:policy")
    g.pool("rollout", workers=1)
    prompts = g.source("prompts", task="arithmetic", group_size=8, groups_per_step=16)
    ...
    g.chain(prompts, rollout, judge, advantage, train)

Every node remembers the file and line that made it, so every validation error names both.
A stage function may call :func:`log_metric` (``from pivotflow.graph import log_metric``) to
log a scalar into the step records (``logged_metrics``; ``controller/user_metrics.py``).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from pivotflow.controller.user_metrics import log_metric  # noqa: F401 (for graph files)
from pivotflow.defaults import ENGINE_KINDS
from pivotflow.errors import GraphError, TaskError
from pivotflow.stage_options import (
    DEFAULT_CONCURRENCY,
    DEFAULT_DEADLINE_S,
    fault_options,
    field_names,
    tool_options,
)
from pivotflow.tasks.datasets import PromptTable, load_prompt_file
from pivotflow.worker.train_config import check_train_options

NodeKind = Literal["source", "generate", "judge", "reference", "reward_model", "critic", "map",
                   "group", "filter", "train"]

# Fields the runtime itself fills, by the kind of node that writes them.
SOURCE_FIELDS = frozenset({"prompt", "answer", "prompt_ids", "prompt_id", "group_id", "sample_id"})
GENERATE_FIELDS = frozenset(
    {"response", "response_ids", "logprobs", "versions", "finish_reason", "completion",
     "prompt_text", "sequence_text"}
)
# ... of which these are decoded only for a graph whose stages name them (a cost per sample):
# the prompt as the policy read it (its chat template rendered) and the whole sequence, prompt
# then response, special tokens kept (OpenRLHF's reward functions' prompts and queries)
TEXT_FIELDS = frozenset({"prompt_text", "sequence_text"})
JUDGE_FIELDS = frozenset({"verdict", "reward", "judge_failed"})
REFERENCE_FIELDS = frozenset({"ref_logprobs"})
REWARD_MODEL_FIELDS = frozenset({"reward"})
CRITIC_FIELDS = frozenset({"values"})
# ... and what the train stage reads besides when the graph has a critic (its value targets)
CRITIC_TRAIN_READS = frozenset({"values", "returns"})
# ... and what the controller writes itself (the task's exact check of a response)
RUNTIME_FIELDS = frozenset({"correct", "advantage"})
TRAIN_READS = frozenset({"prompt_ids", "response_ids", "logprobs", "advantage"})
# ... and what a generate stage with tools writes besides (the trainer reads loss_mask if there)
TOOL_FIELDS = frozenset({"loss_mask", "trajectory", "turns", "tool_calls", "tool_errors"})


@dataclass(slots=True)
class Node:
    """One stage. ``reads``/``writes`` are sample field names, checked along every edge."""

    name: str
    kind: NodeKind
    where: str  # "file.py:line" of the call that made the node
    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    fn: Callable[..., Any] | None = None
    model: str | None = None
    pool: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"<{self.kind} {self.name!r} at {self.where}>"


@dataclass(slots=True)
class ModelSpec:
    name: str
    source: str  # "builtin:policy" | "builtin:judge" | a checkpoint directory
    engine: str | None  # what its generating pools run unless --set says (None: the run's)
    where: str
    context: int | None = None  # max positions to serve, when not the checkpoint's
    adapter: str | None = None  # a PEFT LoRA adapter folder merged into the weights at load


@dataclass(slots=True)
class PoolSpec:
    name: str
    workers: int
    where: str


def _prompt_table(name: str, where: str, path: str, prompt_key: str,
                  answer_key: str | None) -> PromptTable:
    file = Path(path)
    if not file.is_absolute() and not file.exists():
        beside = Path(where.rsplit(":", 1)[0]).parent / file  # beside the graph file
        file = beside if beside.exists() else file
    reserved = SOURCE_FIELDS | GENERATE_FIELDS | JUDGE_FIELDS | TOOL_FIELDS | RUNTIME_FIELDS
    try:
        return load_prompt_file(file, prompt_key=prompt_key, answer_key=answer_key,
                                reserved=reserved)
    except TaskError as exc:
        raise GraphError(f"source {name!r} at {where}: {exc}") from None


def _caller_where() -> str:
    """file:line of the first frame outside this module (the user's graph file)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def fn_reads(fn: Callable[..., Any], where: str, node: str) -> frozenset[str]:
    """Sample fields a user function reads: its named parameters (``**kwargs`` gets the rest)."""
    if not callable(fn):
        raise GraphError(f"node {node!r} at {where}: {fn!r} is not callable")
    names = set()
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty:
            names.add(p.name)
        elif p.kind is p.VAR_POSITIONAL:
            raise GraphError(f"node {node!r} at {where}: {fn.__name__} takes *args; "
                             "stage functions take sample fields by name")
    return frozenset(names)


class Graph:
    """A dataflow graph of RL stages, with the models and worker pools it runs on."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: dict[str, Node] = {}
        self.edges: list[tuple[str, str, bool]] = []  # (src, dst, declared_loop)
        self.models: dict[str, ModelSpec] = {}
        self.pools: dict[str, PoolSpec] = {}
        self.where = _caller_where()

    # ------------------------------------------------------------ resources

    def model(self, name: str, *, source: str, engine: str | None = None,
              context: int | None = None, adapter: str | None = None) -> ModelSpec:
        """Declare a model: ``builtin:policy``, ``builtin:judge`` or a checkpoint directory.
        ``engine`` (``torch``, ``vllm``, ``sglang``): what the pools that generate with it
        run, unless ``--set engine=KIND`` or ``--set engine.POOL=KIND`` says otherwise
        (None: the run's ``engine``, ``torch`` by default).
        ``context`` serves it with that many positions instead of the checkpoint's (RoPE has
        no learned positions; quality past the trained length is the model's own).
        ``adapter``: a PEFT LoRA adapter folder (an SFT run's, say) merged into ``source``'s
        weights when the run loads them; the run starts from the merged model."""
        spec = ModelSpec(name, source, engine, _caller_where(), context, adapter or None)
        if engine is not None and engine not in ENGINE_KINDS:
            raise GraphError(f"model {name!r} at {spec.where}: unknown engine {engine!r}; "
                             f"valid: {', '.join(ENGINE_KINDS)}")
        if name in self.models:
            raise GraphError(f"model {name!r} declared twice (at {self.models[name].where} "
                             f"and {spec.where})")
        self.models[name] = spec
        return spec

    def pool(self, name: str, *, workers: int = 1) -> PoolSpec:
        """Declare a worker pool with its initial size (planners may resize it at run time)."""
        spec = PoolSpec(name, workers, _caller_where())
        if name in self.pools:
            raise GraphError(f"pool {name!r} declared twice (at {self.pools[name].where} "
                             f"and {spec.where})")
        if not isinstance(workers, int) or workers < 0:
            raise GraphError(f"pool {name!r} at {spec.where}: workers must be an int >= 0")
        self.pools[name] = spec
        return spec

    # ------------------------------------------------------------ nodes

    def _add(self, node: Node) -> Node:
        if node.name in self.nodes:
            raise GraphError(f"node {node.name!r} at {node.where} has the same name as the node "
                             f"at {self.nodes[node.name].where}")
        self.nodes[node.name] = node
        return node

    def source(self, name: str, *, task: str | None = None, path: str | None = None,
               group_size: int = 8, groups_per_step: int = 8, prompt_key: str = "prompt",
               answer_key: str | None = "answer", shuffle: bool = True,
               chat_template: bool = False, eval_path: str | None = None,
               **task_options: Any) -> Node:
        """Prompts from a built-in task or a JSONL/Parquet file; each prompt becomes a group.

        A file's rows are read and checked here (``pivotflow.tasks.datasets``): ``prompt_key``
        and ``answer_key`` name its prompt and answer columns (``answer_key`` may reach into a
        struct column with dots, as verl's datasets hold it: ``"reward_model.ground_truth"``),
        and every other column becomes a sample field the stages may read. A relative ``path`` is taken from the working
        directory, else from the graph file's. With ``shuffle`` each pass over the file is in
        a new seeded order (verl's and TRL's default); else in file order.

        The prompt column may hold strings or lists of chat messages (``[{"role": "user",
        "content": ...}]``, as verl's and TRL's datasets do). Messages are always rendered with
        the policy's chat template (``add_generation_prompt=True``); a string prompt is encoded
        raw (with the tokenizer's BOS, where it has one) unless ``chat_template=True``, which
        renders it as one user message. The ``prompt`` field keeps what the row held.

        ``eval_path`` is a file of held-out prompts in the same columns, for the run's
        evaluation rounds (``--set eval_every=N``; its first ``eval_prompts`` rows). A task's
        rounds need none: they draw a fixed set of the task's prompts with a seed of their own
        (``controller/evaluation.py``)."""
        where = _caller_where()
        if (task is None) == (path is None):
            raise GraphError(f"source {name!r} at {where}: give exactly one of task= or path=")
        if not isinstance(chat_template, bool):
            raise GraphError(f"source {name!r} at {where}: chat_template must be True or "
                             f"False, got {chat_template!r}")
        opts: dict[str, Any] = {"task": task, "path": path, "group_size": group_size,
                                "groups_per_step": groups_per_step, "shuffle": shuffle,
                                "chat_template": chat_template, "task_options": task_options}
        writes = SOURCE_FIELDS
        if path is not None:
            table = _prompt_table(name, where, path, prompt_key, answer_key)
            opts["table"] = table
            writes = writes | frozenset(table.columns)
        if eval_path is not None:
            held_out = _prompt_table(name, where, eval_path, prompt_key, answer_key)
            if opts.get("table") is not None and held_out.columns != opts["table"].columns:
                raise GraphError(f"source {name!r} at {where}: eval_path {eval_path} has the "
                                 f"columns {sorted(held_out.columns)}, the prompts "
                                 f"{sorted(opts['table'].columns)}")
            opts["eval_table"] = held_out
            writes = writes | frozenset(held_out.columns)
        return self._add(Node(name, "source", where, writes=writes, options=opts))

    def generate(self, name: str, *, model: str, pool: str, max_tokens: int = 8,
                 temperature: float = 1.0, top_p: float = 1.0, min_tokens: int = 0,
                 tools: Iterable[Any] | None = None, max_turns: int = 4,
                 tool_parser: str = "hermes", max_total_tokens: int | None = None,
                 tool_pool: dict[str, Any] | None = None, tools_in_prompt: bool = True,
                 routing_replay: bool = False) -> Node:
        """The policy generates a response for each sample, streamed per sample. A sample's own
        ``max_tokens`` / ``min_tokens`` fields, when an upstream stage wrote them, override the
        stage's (a per-sample length budget); no stop token is sampled before ``min_tokens``.

        With ``tools`` (``"module:attr"`` paths or ``@tool`` objects) the rollout is multi-turn:
        each turn (up to ``max_tokens``) ends at EOS or when a call closes; the calls run in a
        sandboxed tool pool (``tool_pool`` options: workers, timeout_s, cpu_s, memory_mb,
        max_output_chars, ...), their results are appended as tokens the loss skips, and the
        policy continues, for at most ``max_turns`` turns and ``max_total_tokens`` response
        tokens. ``response`` is then the last turn's text and ``trajectory`` the whole. A prompt
        the chat template renders (chat messages, or a source's ``chat_template=True``) is
        rendered with the tools' schemas (``tools=`` of ``apply_chat_template``, as verl's
        multi-turn rollouts render them: Qwen2.5's template lists them in its system message);
        ``tools_in_prompt=False`` leaves them out (a dataset whose prompts describe the tools
        themselves).

        ``routing_replay=True`` (a mixture-of-experts policy on the embedded engine: rollout
        routing replay, R3, arXiv:2510.11370; verl's and slime's router replay): the engine
        records the experts each token went through, the sample carries them (``routing``)
        and the trainer's forward passes use them instead of choosing again, so a routing
        decision that bf16 rounding flipped in the rollout is not a different expert in
        training (``bench/moe.py`` measures the logprob gap with and without)."""
        where = _caller_where()
        opts: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature,
                                "top_p": top_p, "min_tokens": min_tokens}
        writes = GENERATE_FIELDS
        if routing_replay:
            opts["routing_replay"] = True
            writes = writes | {"routing"}
        if tools is not None:
            opts.update(tool_options(name, where, tools, max_turns, tool_parser,
                                     max_total_tokens, tool_pool or {}),
                        tools_in_prompt=bool(tools_in_prompt))
            writes = writes | TOOL_FIELDS
        return self._add(Node(name, "generate", where, reads=frozenset({"prompt_ids"}),
                              writes=writes, model=model, pool=pool, options=opts))

    def judge(self, name: str, *, model: str, pool: str, template: Callable[..., Any],
              parse: Callable[..., float | None], max_tokens: int = 8,
              deadline_s: float | None = DEFAULT_DEADLINE_S, on_error: str = "stop") -> Node:
        """A generative reward model: ``template(**fields)`` makes the judge's prompt (a string,
        or chat messages rendered with the *judge's* chat template), the judge generates a
        verdict greedily (up to ``max_tokens``), ``parse(verdict, **fields)`` turns its decoded
        text into a reward (None = failed judgement, counted, never silently 0). The contract,
        and parsers for the common forms (``\\boxed{}``, a final Yes/No, a score), are in
        ``pivotflow.verdicts``. ``deadline_s`` and ``on_error`` govern ``template`` and
        ``parse`` as they do a map stage's function."""
        where = _caller_where()
        reads = fn_reads(template, where, name) | (fn_reads(parse, where, name) - {"verdict"})
        opts = {"template": template, "parse": parse, "max_tokens": max_tokens,
                **fault_options("judge", name, where, deadline_s, on_error)}
        return self._add(Node(name, "judge", where, reads=reads, writes=JUDGE_FIELDS,
                              model=model, pool=pool, options=opts))

    def reference(self, name: str, *, model: str, pool: str) -> Node:
        """A frozen reference model scores each response: ``ref_logprobs``, the log-probability
        of every response token under it, for the trainer's KL penalty (``train(...,
        kl_coef=...)``). When ``model`` is the one a train stage trains, the reference is a
        frozen copy of its initial weights (published as ``<model>.ref``, never updated);
        any other declared model is used as it is. It runs on ``pool`` like any model stage,
        so the planner can shift workers to and from it."""
        return self._add(Node(name, "reference", _caller_where(),
                              reads=frozenset({"prompt_ids", "response_ids"}),
                              writes=REFERENCE_FIELDS, model=model, pool=pool))

    def reward_model(self, name: str, *, model: str, pool: str,
                     template: Callable[..., Any] | None = None,
                     deadline_s: float | None = DEFAULT_DEADLINE_S,
                     on_error: str = "stop") -> Node:
        """A discriminative reward model scores each response: ``reward``, the ``score`` head
        of a Hugging Face ``*ForSequenceClassification`` folder with one label (a Skywork- or
        RM-style reward model; OpenRLHF's ``--reward_pretrain``, verl's ``reward_model``) at
        the last token. It reads the prompt and the response as one conversation rendered
        with the *reward model's* chat template (no generation prompt: the text ends with the
        answer), since it may tokenize differently from the policy; ``template(**fields)``
        may return that conversation itself (chat messages, or a string read as it is).
        A sequence the model cannot read (longer than its context) stops the run, naming the
        stage and sample. ``deadline_s`` and ``on_error`` govern ``template`` as they do a map
        stage's function."""
        where = _caller_where()
        reads = (fn_reads(template, where, name) if template is not None
                 else frozenset({"prompt", "response"}))
        opts = {"template": template,
                **fault_options("reward_model", name, where, deadline_s, on_error)}
        return self._add(Node(name, "reward_model", where, reads=reads,
                              writes=REWARD_MODEL_FIELDS, model=model, pool=pool, options=opts))

    def critic(self, name: str, *, model: str, pool: str) -> Node:
        """A learned value model scores each response: ``values``, its estimate of the return
        from the state before every response token (PPO's critic; verl's and OpenRLHF's
        ``advantage_estimator=gae``). A ``map`` after it turns the reward and the values into
        per-token advantages and value targets (``pivotflow.rl.group_fns.gae_advantage``
        writes ``advantage`` and ``returns``), and the train stage then trains the critic
        beside the policy, on the same batch (``critic_lr``, ``value_clip``): every step
        publishes a new version of both, and this stage scores each sample with the newest.

        ``model`` is a Hugging Face folder: a causal LM (the policy's base, as verl starts its
        critic; the run gives it a value head that starts at zero, so the first advantages are
        the rewards) or a ``*ForSequenceClassification`` with one label (a reward model, as
        OpenRLHF starts its critic; its score head becomes the value head). It must not be the
        model the train stage trains as the policy."""
        return self._add(Node(name, "critic", _caller_where(),
                              reads=frozenset({"prompt_ids", "response_ids"}),
                              writes=CRITIC_FIELDS, model=model, pool=pool))

    def map(self, name: str, fn: Callable[..., Any], *, writes: Iterable[str],
            deadline_s: float | None = DEFAULT_DEADLINE_S, on_error: str = "stop",
            concurrency: int = DEFAULT_CONCURRENCY) -> Node:
        """Per-sample Python: ``fn(**fields)`` returns a value (one field) or a dict of fields.
        A call that raises, returns a non-number ``reward``/``advantage`` or a NaN, or takes
        over ``deadline_s`` is a StageError naming the sample: ``on_error="stop"`` stops the
        run with it, ``"skip"`` drops the sample's group (counted as ``groups_skipped``).
        An ``async def`` function is awaited on the controller's loop, up to ``concurrency``
        calls of the stage at once, while the run goes on (a reward server, an LLM judge
        behind an API); a plain function runs inline and holds the loop while it runs."""
        where = _caller_where()
        return self._add(Node(name, "map", where, reads=fn_reads(fn, where, name),
                              writes=field_names(writes, where, name), fn=fn,
                              options=fault_options("map", name, where, deadline_s,
                                                    on_error, concurrency)))

    def group(self, name: str, fn: Callable[..., Any], *, writes: Iterable[str],
              deadline_s: float | None = DEFAULT_DEADLINE_S, on_error: str = "stop",
              concurrency: int = DEFAULT_CONCURRENCY) -> Node:
        """Per-group Python: ``fn(**fields)`` gets each field as a list over the group's samples
        and returns a dict of per-sample lists (e.g. advantages from rewards); ``deadline_s``,
        ``on_error`` and ``concurrency`` (groups at once, for an ``async def`` function) as
        for :meth:`map`."""
        where = _caller_where()
        return self._add(Node(name, "group", where, reads=fn_reads(fn, where, name),
                              writes=field_names(writes, where, name), fn=fn,
                              options=fault_options("group", name, where, deadline_s,
                                                    on_error, concurrency)))

    def filter(self, name: str, fn: Callable[..., bool], *,
               deadline_s: float | None = DEFAULT_DEADLINE_S, on_error: str = "stop",
               concurrency: int = DEFAULT_CONCURRENCY) -> Node:
        """Per-group keep/drop: ``fn(**fields)`` with per-group lists; False drops the group.
        ``deadline_s``, ``on_error`` and ``concurrency`` as for :meth:`group`."""
        where = _caller_where()
        return self._add(Node(name, "filter", where, reads=fn_reads(fn, where, name), fn=fn,
                              options=fault_options("filter", name, where, deadline_s,
                                                    on_error, concurrency)))

    def train(self, name: str, *, model: str, pool: str, lr: float = 3e-4,
              kl_coef: float = 0.0, kl_estimator: str = "k3", **loss_options: Any) -> Node:
        """Optimizer steps on groups as they complete; publishes each new policy version.
        ``loss_options`` are the rest of ``worker.train_config.TrainConfig`` (the learning
        rate's lr_schedule, lr_warmup_steps, lr_decay_steps and min_lr_ratio; clip_eps,
        clip_eps_high, dual_clip (verl's clip_ratio_c), aggregation,
        importance_sampling_level (GSPO's "sequence"),
        decoupled_loss, behavior_weight_cap, entropy_coef, top_entropy_quantile (TRL's),
        max_grad_norm, micro_batch_tokens,
        the updates a step takes (mini_batches, epochs),
        train_dtype, the memory knobs gradient_checkpointing and logits_chunk_tokens,
        LoRA's lora_rank, lora_alpha and lora_target_modules, whiten_advantages for
        per-token advantages (GAE's, REINFORCE++'s), batch_std (TRL's scale_rewards="batch":
        each advantage over the step's reward std), and with a critic stage (:meth:`critic`)
        critic_lr, value_clip, critic_warmup, critic_lora_rank and critic_lora_alpha), checked
        here.

        ``kl_coef`` > 0 adds GRPO's KL penalty, ``kl_coef * KL(policy || reference)`` per
        token (``kl_estimator`` "k1" or "k3", Schulman's estimators), against the
        ``ref_logprobs`` of a :meth:`reference` stage upstream; the step records report it as
        ``train_kl_ref`` whenever the samples carry reference logprobs. Under LoRA
        (``lora_rank`` > 0) the trainer's frozen base is the reference and no reference stage
        is needed (verl's reference in the actor): it scores each micro-batch once more with
        the adapters left out."""
        where = _caller_where()
        if "critic_model" in loss_options:  # (the run fills it in from the graph)
            raise GraphError(f"train {name!r} at {where}: critic_model is the model of the "
                             "graph's critic stage (Graph.critic); declare one instead")
        try:  # typed, with one default each (worker/train_config.py): a typo is an error here
            cfg = check_train_options({"lr": lr, "kl_coef": kl_coef, "kl_estimator": kl_estimator,
                                       **loss_options})
        except ValueError as exc:
            raise GraphError(f"train {name!r} at {where}: {exc}") from None
        opts = msgspec.structs.asdict(cfg)
        # (under LoRA the trainer's frozen base is the reference: no stage needs to write it)
        reads = TRAIN_READS | (REFERENCE_FIELDS if cfg.kl_coef > 0 and not cfg.lora_rank
                               else frozenset())
        return self._add(Node(name, "train", where, reads=reads, model=model, pool=pool,
                              options=opts))

    def weights_of(self, node: Node) -> str:
        """The parameter-store name a model stage's pool loads: a reference stage on a model
        that a train stage trains reads the frozen ``<model>.ref``; every other, the model."""
        model = node.model or ""
        if node.kind == "reference" and any(n.kind == "train" and n.model == model
                                            for n in self.nodes.values()):
            return f"{model}.ref"
        return model

    def prompt_tools(self) -> list[dict[str, Any]] | None:
        """The tool schemas a chat-templated prompt is rendered with: those of the first
        generate stage with tools (``tools_in_prompt``), or None."""
        for node in self.order():
            if node.kind == "generate" and "tools" in node.options:
                if not node.options.get("tools_in_prompt", True):
                    return None
                return list(node.options["tools"].schemas())
        return None

    def critic_model(self) -> str | None:
        """The model of the graph's critic stage (the trainer steps it too), or None."""
        return next((n.model for n in self.nodes.values() if n.kind == "critic"), None)

    # ------------------------------------------------------------ edges

    def connect(self, src: Node, dst: Node, *, loop: bool = False) -> None:
        """An edge from ``src`` to ``dst``; ``loop=True`` declares an intended cycle."""
        for n in (src, dst):
            if not isinstance(n, Node) or self.nodes.get(n.name) is not n:
                raise GraphError(f"connect at {_caller_where()}: {n!r} is not a node of "
                                 f"graph {self.name!r}")
        self.edges.append((src.name, dst.name, loop))

    def chain(self, *nodes: Node) -> None:
        """Connect each node to the next."""
        for a, b in zip(nodes, nodes[1:], strict=False):
            self.connect(a, b)

    def order(self) -> list[Node]:
        """Nodes from the source down the (validated) chain."""
        from pivotflow.graph_check import linear_order

        return [self.nodes[n] for n in linear_order(self)]

    def describe(self) -> str:
        lines = [f"graph {self.name!r} ({self.where})"]
        for n in self.order():
            res = f" model={n.model} pool={n.pool}" if n.model else ""
            if "tools" in n.options:
                res += (f" tools={n.options['tools'].names} "
                        f"max_turns={n.options['max_turns']}")
            lines.append(f"  {n.kind:8s} {n.name}{res}  reads={sorted(n.reads)} "
                         f"writes={sorted(n.writes)}")
        lines.append("  pools: " + ", ".join(f"{p.name}={p.workers}" for p in self.pools.values()))
        lines.append("  models: " + ", ".join(
            f"{m.name}={m.source}" + (f" (engine {m.engine})" if m.engine else "")
            for m in self.models.values()))
        return "\n".join(lines)
