"""What a run needs before workers start: models in the parameter store, tokenizers, prompts."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivotflow.errors import CheckpointError, GraphError, ModelConfigError, PivotflowError
from pivotflow.graph import Graph, ModelSpec, Node
from pivotflow.messages import is_messages
from pivotflow.params.base import ParamStore
from pivotflow.tasks.registry import Problem, get_task
from pivotflow.tokenizer.base import Tokenizer

if TYPE_CHECKING:
    from pivotflow.config import RunConfig
    from pivotflow.controller.evaluation import Evaluation

# What a tokenizer folder holds (any of them); checked first so that a folder without any says
# so in one line instead of failing on whichever file a loader looks for first.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass
class Models:
    tokenizers: dict[str, Tokenizer] = field(default_factory=dict)
    dirs: dict[str, Path] = field(default_factory=dict)


def model_dir(spec: ModelSpec, seed: int, console: Any = None) -> Path:
    """The folder of a declared model: a built-in one (bootstrapped into the cache once) or the
    path the graph names."""
    if not spec.source.startswith("builtin:"):
        return Path(spec.source)
    which = spec.source.split(":", 1)[1]
    if which not in ("policy", "judge", "tool_policy"):
        raise GraphError(f"model {spec.name!r} at {spec.where}: unknown built-in "
                         f"{spec.source!r} (builtin:policy, builtin:judge or "
                         "builtin:tool_policy)")
    if which == "tool_policy":  # the policy taught the calculator's call format
        from pivotflow.tasks.tool_policy import ensure_tool_policy

        return ensure_tool_policy(seed=seed, progress=console is not False)
    from pivotflow.tasks.cache import ensure_models

    policy, judge = ensure_models(seed=seed, progress=console is not False)
    return policy if which == "policy" else judge


def tokenizer_of(path: Path, vocab_size: int) -> Tokenizer:
    """The tokenizer saved in a model folder; raises a one-line error for a folder without one
    and for one with more ids than the model's embedding has rows."""
    from pivotflow.tokenizer import load_tokenizer

    if not any((path / name).exists() for name in TOKENIZER_FILES):
        raise CheckpointError(f"{path}: no tokenizer files (none of {', '.join(TOKENIZER_FILES)});"
                              " save the model's tokenizer next to its weights "
                              "(tokenizer.save_pretrained(folder))")
    tok = load_tokenizer(path)
    if tok.vocab_size > vocab_size:
        tok_file = next(path / n for n in TOKENIZER_FILES if (path / n).exists())
        raise ModelConfigError(f"{tok_file}: the tokenizer has {tok.vocab_size} tokens, more "
                               f"than {path / 'config.json'}: vocab_size {vocab_size} (ids "
                               f">= {vocab_size} have no embedding)")
    return tok


def prepare_models(graph: Graph, store: ParamStore, *, seed: int,
                   console: Any = None) -> Models:
    """Resolve each declared model to its folder (bootstrapping the built-in ones once), load
    its tokenizer, and publish its weights and config (as config.json holds it, ``context``
    applied) to the store as version 0. Every error is one line naming the file and key."""
    from pivotflow.engines.torch.hf_config import with_context
    from pivotflow.engines.torch.weights import load_model_folder

    models = Models()
    # a reference stage on a trained model reads a frozen copy of its initial weights
    frozen = {graph.weights_of(n): n.model for n in graph.order()
              if n.kind == "reference" and graph.weights_of(n) != n.model}
    critics = {n.model for n in graph.order() if n.kind == "critic"}
    for spec in graph.models.values():
        path = model_dir(spec, seed, console)
        if spec.context is not None and spec.context < 2:
            raise GraphError(f"model {spec.name!r} at {spec.where}: context {spec.context} "
                             "must be >= 2")
        try:
            if not path.is_dir():
                raise CheckpointError(f"{path}: no such model folder")
            folder = load_model_folder(path)
            tok = tokenizer_of(path, folder.config.vocab_size)
        except PivotflowError as exc:
            raise type(exc)(f"model {spec.name!r} at {spec.where}: {exc}") from None
        check_model_heads(graph, spec.name, folder.config.num_labels, path)
        for node in graph.order():
            knob = next((k for k in ("routing_replay", "router_aux_loss_coef")
                         if node.options.get(k)), None)  # (what only experts have)
            if node.model == spec.name and knob and not folder.config.sparse_layers:
                raise GraphError(f"{node.kind} {node.name!r} at {node.where}: {knob} "
                                 f"needs a mixture-of-experts model; {spec.name!r} "
                                 f"({path / 'config.json'}) is a dense "
                                 f"{folder.config.architecture}")
        tensors = folder.tensors
        if spec.adapter:  # (an SFT adapter: the run starts from base + its update)
            from pivotflow.params.hf_layout import disk_layout, held_layout
            from pivotflow.worker.lora import merge_peft_adapter

            try:  # (merged in the file's layout: a Phi-3 adapter targets qkv_proj)
                tensors = held_layout(folder.hf_config, merge_peft_adapter(
                    disk_layout(folder.hf_config, tensors), Path(spec.adapter)), str(path))
            except PivotflowError as exc:
                raise type(exc)(f"model {spec.name!r} at {spec.where}: adapter: {exc}") from None
        hf_config = dict(folder.hf_config)
        if spec.name in critics and not folder.config.num_labels:
            tensors, hf_config = value_model(tensors, hf_config, folder.config,
                                             f"model {spec.name!r} at {spec.where}")
        if spec.context is not None:  # RoPE has no learned positions: serve more (or fewer)
            hf_config = with_context(hf_config, spec.context, str(path / "config.json"))
        store.publish(spec.name, 0, tensors, hf_config)
        for copy, of in frozen.items():
            if of == spec.name:
                store.publish(copy, 0, tensors, hf_config)
        models.tokenizers[spec.name] = tok
        models.dirs[spec.name] = path
    check_chat_templates(graph, models)
    check_reference_tokenizers(graph, models)
    check_reward_model_templates(graph, models)
    return models


def value_model(tensors: dict[str, Any], hf_config: dict[str, Any],
                config: Any, where: str = "critic") -> tuple[dict[str, Any], dict[str, Any]]:
    """A causal LM as a critic (verl starts its critic from the policy's base): its body, and a
    one-label ``score`` head of zeros in place of the LM head, so the critic starts predicting
    0 everywhere and the first advantages are the rewards themselves, not a random head's
    noise. The config becomes the ``*ForSequenceClassification`` transformers loads it as;
    a family transformers has no such class for is a GraphError naming ``where``."""
    import torch

    from pivotflow.engines.torch.hf_config import HF_CLASSIFIERS

    if config.architecture not in HF_CLASSIFIERS:
        raise GraphError(
            f"{where}: a critic is a sequence classifier, and transformers has none for "
            f"{config.architecture} (a critic's folder must load there; families with one: "
            f"{', '.join(HF_CLASSIFIERS)})")

    body = {k: v for k, v in tensors.items() if not k.startswith("lm_head.")}
    like = body["model.embed_tokens.weight"]
    body["score.weight"] = torch.zeros(1, config.hidden_size, dtype=like.dtype)
    out = {k: v for k, v in hf_config.items() if k not in ("id2label", "label2id")}
    out.update(architectures=[HF_CLASSIFIERS[config.architecture]], num_labels=1,
               id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    return body, out


def check_model_heads(graph: Graph, model: str, num_labels: int, path: Path) -> None:
    """A reward_model stage's model is a sequence classifier with one label, and no other
    model stage's is one (a classifier scores sequences: it cannot generate or be trained); a
    critic's is a causal LM (given a value head) or a one-label classifier."""
    for node in graph.order():
        if node.model != model:
            continue
        if node.kind == "critic":
            if num_labels > 1:
                raise GraphError(f"critic {node.name!r} at {node.where}: model {model!r} "
                                 f"({path / 'config.json'}) is a classifier with {num_labels} "
                                 "labels; a critic is a causal LM or a one-label classifier")
            continue
        if node.kind == "reward_model" and num_labels != 1:
            what = "a causal LM" if not num_labels else f"a classifier with {num_labels} labels"
            raise GraphError(f"reward_model {node.name!r} at {node.where}: model {model!r} "
                             f"({path / 'config.json'}) is {what}; a reward model is a "
                             "*ForSequenceClassification folder with num_labels 1")
        if node.kind != "reward_model" and num_labels:
            raise GraphError(f"{node.kind} {node.name!r} at {node.where}: model {model!r} "
                             f"({path / 'config.json'}) is a sequence classifier, which scores "
                             "sequences and cannot generate or train; use it in a reward_model "
                             "stage")


def check_reward_model_templates(graph: Graph, models: Models) -> None:
    """A reward_model stage without a template renders the conversation with its model's
    chat template, so that tokenizer must have one."""
    for node in graph.order():
        if (node.kind == "reward_model" and node.options.get("template") is None
                and models.tokenizers[node.model or ""].chat_template is None):
            raise GraphError(f"reward_model {node.name!r} at {node.where}: the tokenizer of "
                             f"model {node.model!r} ({models.dirs[node.model or '']}) has no "
                             "chat template to render the conversation with; give the stage "
                             "template=... returning the text the reward model reads")


def check_reference_tokenizers(graph: Graph, models: Models) -> None:
    """A reference model (or a critic) that is not the policy scores the policy's token ids, so
    it must read
    them as the same text: the same vocabulary, token for token, and the same stop tokens (a
    different tokenizer would give a KL over unrelated tokens)."""
    order = graph.order()
    policy = next((n.model for n in order if n.kind == "generate"), None)
    for node in order:
        if node.kind not in ("reference", "critic") or policy is None or node.model == policy:
            continue
        ref, pol = models.tokenizers[node.model or ""], models.tokenizers[policy]
        why = ""
        if ref.vocab_size != pol.vocab_size:
            why = f"{ref.vocab_size} tokens vs {pol.vocab_size}"
        elif tuple(ref.eos_ids) != tuple(pol.eos_ids):
            why = f"stop ids {list(ref.eos_ids)} vs {list(pol.eos_ids)}"
        else:  # one decode of every id each: cheap even for 150k-token vocabularies
            every = list(range(pol.vocab_size))
            if ref.decode(every, skip_special=False) != pol.decode(every, skip_special=False):
                why = "the same ids decode to other text"
        if why:
            raise GraphError(
                f"{node.kind} {node.name!r} at {node.where}: model {node.model!r} has another "
                f"tokenizer than the policy {policy!r} ({why}); a {node.kind} must read the "
                "policy's token ids")


def check_chat_templates(graph: Graph, models: Models) -> None:
    """Before any process starts: a source whose prompts need the policy's chat template (chat
    messages, or ``chat_template=True``) names a model that has one."""
    source = graph.order()[0]
    table = source.options.get("table")
    needs = bool(source.options.get("chat_template")) or (
        table is not None and any(is_messages(r["prompt"]) for r in table.rows))
    policy = next((n.model for n in graph.order() if n.kind == "generate"), None)
    if not needs or policy is None:
        return
    if models.tokenizers[policy].chat_template is None:
        why = "chat_template=True" if source.options.get("chat_template") else \
            f"{getattr(table, 'path', 'the prompt file')} holds chat messages"
        raise GraphError(f"source {source.name!r} at {source.where}: {why}, but the tokenizer "
                         f"of model {policy!r} ({models.dirs[policy]}) has no chat template "
                         "(no chat_template.jinja, no 'chat_template' in tokenizer_config.json)")


class ProblemStream:
    """The source's prompts: drawn from a task with a seed, or passed over a file's rows (each
    pass in a new order drawn from the seed and the pass, so ``cursor`` alone resumes it)."""

    def __init__(self, node: Node, *, seed: int) -> None:
        opts = node.options
        self.seed = seed
        self.rng = random.Random(seed)
        self.cursor = 0
        self.task = None
        self.rows: list[dict[str, Any]] = []
        self.shuffle = bool(opts.get("shuffle", True))
        self._order: tuple[int, list[int]] = (-1, [])  # (pass, row order)
        if opts["task"] is not None:
            self.task = get_task(opts["task"], **opts["task_options"])
        else:
            self.rows = opts["table"].rows
            task_name = opts["task_options"].get("check_with")
            self.task = get_task(task_name) if task_name else None

    def next(self) -> Problem:
        """The next prompt; a file's row keeps its other columns in ``meta``."""
        self.cursor += 1
        if self.rows:
            return row_problem(self.rows[self._row_index(self.cursor - 1)])
        assert self.task is not None
        return self.task.sample(self.rng)

    def _row_index(self, i: int) -> int:
        epoch, at = divmod(i, len(self.rows))
        if not self.shuffle:
            return at
        if self._order[0] != epoch:
            order = list(range(len(self.rows)))
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
            self._order = (epoch, order)
        return self._order[1][at]

    def check(self, answer: str | None, completion: str) -> bool | None:
        """The task's exact rule, or None when the prompts have no rule (or no answer)."""
        if self.task is None or answer is None:
            return None
        return self.task.check(answer, completion)


def row_problem(row: dict[str, Any]) -> Problem:
    """A prompt file's row as a problem: its other columns in ``meta``."""
    extra = {k: v for k, v in row.items() if k not in ("prompt", "answer")}
    return Problem(prompt=row["prompt"], answer=row["answer"], meta=extra)


EVAL_SEED = 7919  # a task's held-out prompts: the same set whatever the run's seed


def eval_problems(node: Node, prompts: int) -> list[Problem]:
    """The held-out prompts of a run's evaluation rounds: the source's ``eval_path`` rows (the
    first ``prompts``), else ``prompts`` distinct prompts of its task drawn with ``EVAL_SEED``.

    Raises:
        GraphError: the source reads a file and names no ``eval_path``.
    """
    from pivotflow.tasks.registry import make_dataset

    opts = node.options
    table = opts.get("eval_table")
    if table is not None:
        return [row_problem(r) for r in table.rows[:prompts]]
    if opts["task"] is None:
        raise GraphError(f"source {node.name!r} at {node.where}: --set eval_every needs "
                         "held-out prompts: give the source eval_path=FILE")
    task = get_task(opts["task"], **opts["task_options"])
    return make_dataset(task, prompts, seed=EVAL_SEED)


def make_evaluation(source: Node, cfg: RunConfig, tok: Tokenizer,
                    on_round: Callable[[dict[str, Any]], None],
                    after: int | None, tools: list[dict[str, Any]] | None = None) -> Evaluation:
    """The run's evaluation rounds (``eval_every``) on the source's held-out prompts;
    ``after``: the last round a resumed run's eval.jsonl holds; ``tools``: the schemas a
    templated prompt is rendered with, as the training prompts are."""
    from pivotflow.controller.evaluation import Evaluation

    return Evaluation(eval_problems(source, cfg.eval_prompts), tok, every=cfg.eval_every,
                      steps=cfg.steps, temperature=cfg.eval_temperature,
                      samples_per_prompt=cfg.eval_samples,
                      chat_template=bool(source.options.get("chat_template")), seed=cfg.seed,
                      on_round=on_round, after=after, tools=tools)
