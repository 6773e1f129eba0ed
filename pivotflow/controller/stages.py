"""What each kind of stage does to samples: turning samples into jobs and results into fields.

Pure functions of (node, sample, result): the controller owns all state and all sockets.
The graph's own functions run through ``user_code.call`` (a deadline, failures named by stage,
graph line and sample) and what they return is checked here, at the stage that returned it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import Any

from pivotflow.controller import user_code
from pivotflow.controller.sample import Sample
from pivotflow.errors import GraphError, TokenizerError
from pivotflow.graph import Node
from pivotflow.messages import encode_conversation, encode_prompt, message_problem, with_answer
from pivotflow.protocol import GenerateJob, JobDone, TrainSeq
from pivotflow.tokenizer.base import Tokenizer

EVAL_TEMPERATURE = "_eval_temperature"  # private key: an evaluation sample's temperature
# stage kinds whose jobs a pool's workers serve
SERVED = ("generate", "judge", "reference", "reward_model", "critic")
PARTIAL = "_partial"  # private key of an aborted job's partial state, consumed on re-dispatch
COUNTED = "_counted"  # private key: tokens of that partial state already counted as generated
# private key: the tokens a response held when a step boundary last cut it (partial rollouts),
# all generated before that boundary and carried over to continue on newer weights
CARRIED = "_carried"
# "call the stage's function now": what the function stages below take unless they are given
# the value an ``async def`` function returned (controller/async_calls.py awaited it)
CALL: Any = object()


def generate_job(node: Node, sample: Sample, job_id: int, tok: Tokenizer,
                 min_version: int) -> GenerateJob:
    """The job that generates (or resumes) a rollout for ``sample``; it stops on any of the
    model's stop tokens (its EOS and generation_config's eos ids)."""
    opts = node.options
    partial: JobDone | None = sample.private.pop(PARTIAL, None)
    return GenerateJob(
        job_id=job_id,
        prompt_ids=sample.fields["prompt_ids"],
        max_tokens=int(sample.fields.get("max_tokens", opts["max_tokens"])),
        min_tokens=int(sample.fields.get("min_tokens", opts.get("min_tokens", 0))),
        # (an evaluation sample's own: controller/evaluation.py)
        temperature=float(sample.private.get(EVAL_TEMPERATURE, opts["temperature"])),
        top_p=float(opts["top_p"]),
        seed=sample.seed,
        stop_token_ids=list(tok.eos_ids),
        prefix_ids=partial.token_ids if partial else [],
        prefix_logprobs=partial.logprobs if partial else [],
        prefix_versions=partial.versions if partial else [],
        min_version=min_version,
    )


def templated(node: Node, sample: Sample) -> str | list[Any]:
    """A judge's or reward model's ``template(**fields)``: a string, or chat messages (checked:
    anything else is a GraphError naming the stage)."""
    out = user_code.call(node, "template", node.options["template"], sample.fields, [sample])
    problem = None if isinstance(out, str) else message_problem(out)
    if problem is not None:
        raise GraphError(f"{node.kind} {node.name!r} at {node.where}: template returned "
                         f"{type(out).__name__}, expected a str or a list of chat messages "
                         f"({problem})")
    return out  # type: ignore[no-any-return]


def judge_job(node: Node, sample: Sample, job_id: int, tok: Tokenizer) -> GenerateJob:
    """The job that asks the GenRM for a verdict on ``sample`` (greedy, judge weights v0+).
    ``template`` returns a string (encoded as is) or chat messages (rendered with the judge's
    chat template): the contract is in ``pivotflow.verdicts``."""
    prompt = templated(node, sample)
    try:
        prompt_ids = encode_prompt(tok, prompt)
    except TokenizerError as exc:  # e.g. messages for a judge without a chat template
        raise GraphError(f"judge {node.name!r} at {node.where}: {exc}") from None
    partial: JobDone | None = sample.private.pop(PARTIAL, None)
    return GenerateJob(
        job_id=job_id,
        prompt_ids=prompt_ids,
        max_tokens=int(node.options["max_tokens"]),
        temperature=0.0,
        seed=sample.seed,
        stop_token_ids=list(tok.eos_ids),
        prefix_ids=partial.token_ids if partial else [],
        prefix_logprobs=partial.logprobs if partial else [],
        prefix_versions=partial.versions if partial else [],
    )


def response_score_job(sample: Sample, job_id: int, min_version: int = 0) -> GenerateJob:
    """The job that asks a score role for one figure per token of ``sample``'s response after
    its prompt: a reference model's logprobs (its weights never change), or a critic's values
    with its weights of at least ``min_version`` (the trainer steps the critic with the
    policy, so the critic is as new as the policy the job goes out under). A score has no
    partial state: one aborted by a shift is sent again whole."""
    sample.private.pop(PARTIAL, None)
    f = sample.fields
    return GenerateJob(job_id=job_id, prompt_ids=f["prompt_ids"], max_tokens=0,
                       prefix_ids=f["response_ids"], min_version=min_version)


def apply_reference(node: Node, sample: Sample, result: JobDone) -> None:
    """Write the reference logprobs; a score the role refused (a response it cannot read) is
    the run's error, named by stage and sample: the KL penalty cannot go without it."""
    if result.error or len(result.logprobs) != len(sample.fields["response_ids"]):
        why = result.error or (f"{len(result.logprobs)} logprobs for "
                               f"{len(sample.fields['response_ids'])} response tokens")
        raise GraphError(f"reference {node.name!r} at {node.where} on sample "
                         f"{sample.sample_id}: {why}")
    sample.fields["ref_logprobs"] = result.logprobs


def apply_values(node: Node, sample: Sample, result: JobDone) -> None:
    """Write the critic's values; one the role refused is the run's error, named by stage and
    sample: GAE cannot go without them."""
    n = len(sample.fields["response_ids"])
    if result.error or len(result.values) != n:
        why = result.error or f"{len(result.values)} values for {n} response tokens"
        raise GraphError(f"critic {node.name!r} at {node.where} on sample "
                         f"{sample.sample_id}: {why}")
    sample.fields["values"] = result.values


def reward_job(node: Node, sample: Sample, job_id: int, tok: Tokenizer) -> GenerateJob:
    """The job that asks a reward model (a score role on a sequence classifier) to score
    ``sample``: the prompt and response as one conversation in the reward model's chat
    template, or what the stage's ``template`` returns. Like a reference score it has no
    partial state: one aborted by a shift is sent again whole."""
    sample.private.pop(PARTIAL, None)
    conversation = (with_answer(sample.fields["prompt"], sample.fields["response"])
                    if node.options.get("template") is None else templated(node, sample))
    try:
        ids = encode_conversation(tok, conversation)
    except TokenizerError as exc:  # e.g. messages for a reward model without a chat template
        raise GraphError(f"reward_model {node.name!r} at {node.where}: {exc}") from None
    return GenerateJob(job_id=job_id, prompt_ids=ids, max_tokens=0)


def apply_reward(node: Node, sample: Sample, result: JobDone) -> None:
    """Write the reward model's score as the reward; a sequence the role refused (longer than
    the reward model reads) is the run's error, named by stage and sample."""
    if result.error or result.score is None:
        why = result.error or "no score in the result"
        raise GraphError(f"reward_model {node.name!r} at {node.where} on sample "
                         f"{sample.sample_id}: {why}")
    sample.fields["reward"] = result.score


def apply_generation(sample: Sample, result: JobDone, tok: Tokenizer) -> None:
    """Write a finished rollout into the sample's fields."""
    text = tok.decode(result.token_ids)
    if result.routing:  # routing replay: the trainer replays the rollout's experts
        sample.fields["routing"] = result.routing
    sample.fields.update(
        response_ids=result.token_ids,
        logprobs=result.logprobs,
        versions=result.versions,
        finish_reason=result.finish_reason,
        response=text,
        completion=text,
    )


def write_texts(sample: Sample, tok: Tokenizer) -> None:
    """``prompt_text`` and ``sequence_text`` (graph.TEXT_FIELDS) of a finished rollout: its
    prompt's ids and its prompt's and response's ids decoded, special tokens kept."""
    f = sample.fields
    prompt = list(f["prompt_ids"])
    f["prompt_text"] = tok.decode(prompt, skip_special=False)
    f["sequence_text"] = tok.decode(prompt + list(f["response_ids"]), skip_special=False)


def apply_verdict(node: Node, sample: Sample, result: JobDone, tok: Tokenizer) -> bool:
    """Parse the judge's verdict (its text, special tokens left out) into ``reward``; False
    when it could not be parsed."""
    verdict = tok.decode(result.token_ids)
    fields = sample.fields
    fields["verdict"] = verdict
    reward = (user_code.call(node, "parse", node.options["parse"], fields, [sample])
              if result.error == "" else None)
    if isinstance(reward, str):  # a number as text ("1.0") is a bug to name, not a verdict
        user_code.check_value(node, [sample], "reward", reward)
    score = (None if isinstance(reward, bool) or not isinstance(reward, (int, float))
             else float(reward))
    user_code.check_value(node, [sample], "reward", score)
    fields["reward"] = score
    fields["judge_failed"] = score is None
    return score is not None


def group_fields(samples: list[Sample]) -> dict[str, list[Any]]:
    """Each field of a group as a list over its samples (what group and filter functions get)."""
    # Samples of a group passed the same stages, so they carry the same fields.
    return {k: [s.fields.get(k) for s in samples] for k in samples[0].fields}


def apply_group_fn(node: Node, samples: list[Sample],
                   out: Any = CALL) -> Awaitable[Any] | None:
    """Run a group function (or take what it returned, ``out``) and scatter its per-sample
    lists back into the samples; an ``async def``'s awaitable is returned instead, unwritten
    (the controller awaits it and passes its value back as ``out``)."""
    assert node.fn is not None  # validated: group nodes always carry a function
    if out is CALL:
        out = user_code.call(node, "function", node.fn, group_fields(samples), samples,
                             awaitable=True)
        if inspect.isawaitable(out):
            return out
    if not isinstance(out, dict):
        if len(node.writes) != 1:
            raise GraphError(f"group {node.name!r} at {node.where} must return a dict of "
                             f"{sorted(node.writes)}")
        out = {next(iter(node.writes)): out}
    for key, values in out.items():
        if key not in node.writes:
            raise GraphError(f"group {node.name!r} at {node.where} returned field {key!r} it "
                             f"does not declare in writes={sorted(node.writes)}")
        values = list(values)
        if len(values) != len(samples):
            raise GraphError(f"group {node.name!r} at {node.where} returned {len(values)} "
                             f"values of {key!r} for a group of {len(samples)}")
        for s, v in zip(samples, values, strict=False):
            user_code.check_value(node, [s], key, v)
        for s, v in zip(samples, values, strict=False):
            s.fields[key] = v
    return None


def apply_map_fn(node: Node, sample: Sample, out: Any = CALL) -> Awaitable[Any] | None:
    """Run a per-sample function (or take what it returned, ``out``) and write its result;
    an awaitable, as :func:`apply_group_fn`."""
    assert node.fn is not None  # validated: map nodes always carry a function
    if out is CALL:
        out = user_code.call(node, "function", node.fn, sample.fields, [sample], awaitable=True)
        if inspect.isawaitable(out):
            return out
    if isinstance(out, dict):
        bad = set(out) - node.writes
        if bad:
            raise GraphError(f"map {node.name!r} at {node.where} returned fields {sorted(bad)} "
                             f"it does not declare in writes={sorted(node.writes)}")
        for key, value in out.items():
            user_code.check_value(node, [sample], key, value)
        sample.fields.update(out)
    elif len(node.writes) == 1:
        key = next(iter(node.writes))
        user_code.check_value(node, [sample], key, out)
        sample.fields[key] = out
    else:
        raise GraphError(f"map {node.name!r} at {node.where} returned a "
                         f"{type(out).__name__}; with writes={sorted(node.writes)} it must "
                         "return a dict")
    return None


def keep_group(node: Node, samples: list[Sample], out: Any = CALL) -> bool | Awaitable[Any]:
    """A filter stage's verdict on a whole group (True keeps it), or the one ``out`` says; an
    awaitable, as :func:`apply_group_fn`."""
    assert node.fn is not None  # validated: filter nodes always carry a function
    if out is CALL:
        out = user_code.call(node, "function", node.fn, group_fields(samples), samples,
                             awaitable=True)
        if inspect.isawaitable(out):
            return out
    return bool(out)


def train_seq(sample: Sample) -> TrainSeq:
    """What the trainer needs of one sample. An ``advantage`` list (GAE's, one per response
    token) travels as ``token_advantages``; with a critic, ``values`` and ``returns`` too."""
    f = sample.fields
    adv = f["advantage"]
    per_token = isinstance(adv, (list, tuple))
    return TrainSeq(job_id=sample.sample_id, prompt_ids=f["prompt_ids"],
                    response_ids=f["response_ids"], logprobs=f["logprobs"],
                    versions=f["versions"], advantage=0.0 if per_token else float(adv),
                    loss_mask=f.get("loss_mask") or [], ref_logprobs=f.get("ref_logprobs") or [],
                    token_advantages=[float(a) for a in adv] if per_token else [],
                    values=f.get("values") or [], returns=f.get("returns") or [],
                    routing=f.get("routing") or b"")
