"""Every message that crosses a socket or a pipe, and nothing else.

Two unions, one per direction of the controller's ROUTER socket: ``ToWorker`` (controller →
worker) and ``ToController`` (worker → controller); and the local launcher's pipe to its worker
zygote (``launch/zygote.py``): ``ForkWorker`` to it, ``FromZygote`` back. Each is decoded by one reused typed msgspec
decoder; a frame that does not decode is a ``ProtocolError``, never an object. No pickle anywhere.
Schemas grow only by appending fields with defaults.
"""

from __future__ import annotations

import msgspec

PROTOCOL_VERSION = 1

# Frames larger than this are refused before decoding (a GenerateJob of the tiny models is ~1 KB).
MAX_FRAME_BYTES = 64 * 1024 * 1024

# The per-job messages: encoded as arrays (no field names on the wire) and untracked by the GC.
# No omit_defaults: msgspec ignores it for array_like structs (checked on 0.23: every default
# is still encoded, the bytes are identical with and without it), so it only misled readers.
_HOT = {"tag": True, "kw_only": True, "array_like": True, "gc": False}


# ---------------------------------------------------------------- worker -> controller


class Hello(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """First message of a worker: who it is and which protocol it speaks."""

    protocol_version: int
    worker_id: str
    pid: int
    # the run's token for this worker id (transport/admission.py), "" from an unlaunched peer
    token: str = ""


class Heartbeat(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """Sent every heartbeat interval; a worker silent for too long is declared dead. ``busy``:
    its compute thread is at work (a role loading, an engine or a train step), which the
    controller reports (Prometheus ``workers_computing``); a busy worker still heartbeats."""

    worker_id: str
    busy: int = 0


class RoleReady(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """The worker has loaded ``role`` with ``model`` at ``version`` and accepts work for it."""

    role: str
    model: str
    version: int
    load_s: float = 0.0
    release_s: float = 0.0
    # of load_s, the role's own start beyond moving weights: building the engine and its KV
    # cache (a trainer: its optimizer state), the part a warmer engine would save
    warmup_s: float = 0.0
    # the role came back from the parked ones (AssignRole.keep): nothing was loaded, and it
    # holds what it held when it was left (a trainer: its weights, optimizer state and group)
    resumed: bool = False


class JobDone(msgspec.Struct, **_HOT):  # type: ignore[call-arg]
    """One generation finished (or was aborted, with its partial state)."""

    job_id: int
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    error: str = ""
    # seconds from the job's arrival at the worker to its result's send (0: not measured);
    # the controller's round trip minus this is the wire and the controller's own time
    worker_s: float = 0.0
    # a reward model's score of the whole sequence (the score role on a sequence classifier,
    # for a reward_model stage; None from every other role)
    score: float | None = None
    # a critic's value of the state before each response token (the score role on a value
    # model, for a critic stage; empty from every other role)
    values: list[float] = []
    # the experts each fed position went through (a mixture-of-experts rollout with routing
    # replay on: ``engines.torch.model.routing_from_bytes``; empty otherwise)
    routing: bytes = b""


class JobsDone(msgspec.Struct, **_HOT):  # type: ignore[call-arg]
    """Generations that finished since the last frame (usually one: results stream)."""

    results: list[JobDone]


class TrainDone(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """An optimizer step finished and ``version`` is published to the parameter store.

    With several trainers every rank answers for its shard; ``stats`` of rank 0 are the whole
    batch's (the ranks all-reduce them)."""

    step: int
    version: int
    stats: dict[str, float]
    job_ids: list[int]
    rank: int = 0


class WorkerFailed(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """The worker's role raised; ``job_ids`` are the jobs it could not finish."""

    error: str
    job_ids: list[int] = []


ToController = Hello | Heartbeat | RoleReady | JobsDone | TrainDone | WorkerFailed


# ---------------------------------------------------------------- controller -> worker


class Welcome(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """Answer to Hello: accepted, with the parameter store's location."""

    protocol_version: int
    store_dir: str
    heartbeat_s: float = 1.0


class Reject(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """Answer to Hello: refused (e.g. protocol mismatch); the worker exits with ``reason``."""

    reason: str


class AssignRole(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """Host ``role`` ("generate", "score" or "train") for ``model``; ``options`` are the role's
    settings. A score role (a reference model) answers each GenerateJob with the logprobs of
    its ``prefix_ids`` after its ``prompt_ids`` under its weights, and generates nothing."""

    role: str
    model: str
    # (a list of names: a trainer's lora_target_modules)
    options: dict[str, float | int | str | bool | list[str]] = {}
    # warm roles: keep the role held now loaded (parked) rather than release it, and take
    # ``role`` back from the parked ones where it is there (RoleReady.resumed)
    keep: bool = False


class GenerateJob(msgspec.Struct, **_HOT):  # type: ignore[call-arg]
    """Generate a continuation of ``prompt_ids`` (after ``prefix_ids`` when resuming), with
    weights of at least ``min_version``."""

    job_id: int
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = -1
    stop_token_ids: list[int] = []
    stop_strings: list[str] = []
    prefix_ids: list[int] = []
    prefix_logprobs: list[float] = []
    prefix_versions: list[int] = []
    min_version: int = 0
    min_tokens: int = 0


class Jobs(msgspec.Struct, **_HOT):  # type: ignore[call-arg]
    """Generation jobs for one worker (several ready samples may share a frame)."""

    jobs: list[GenerateJob]


class AbortJobs(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """Abort these jobs (empty = all); each comes back as a JobDone with reason "abort"."""

    job_ids: list[int] = []


class TrainSeq(msgspec.Struct, kw_only=True, array_like=True, gc=False):  # (see _HOT)
    """One trajectory to train on; ``loss_mask`` is 1 on policy tokens of ``response_ids``;
    ``ref_logprobs`` (one per response token) are the reference model's, from a reference
    stage, for the KL penalty (empty: the graph has none). With a critic (PPO with GAE)
    ``token_advantages`` replace ``advantage`` (one per response token), and ``values`` (the
    critic's, from the critic stage) and ``returns`` are its value targets."""

    job_id: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    advantage: float
    loss_mask: list[int] = []
    ref_logprobs: list[float] = []
    token_advantages: list[float] = []
    values: list[float] = []
    returns: list[float] = []
    # the rollout's expert choices at each position (JobDone.routing), replayed by the trainer
    routing: bytes = b""


class TrainStep(msgspec.Struct, tag=True, kw_only=True):
    """Take one optimizer step on ``seqs`` and publish the result as ``step + 1``.

    Data parallel over ``world`` trainers: ``seqs`` is this rank's shard; the ranks form a gloo
    group at ``rendezvous`` (a fresh path per membership ``epoch``), scale their losses by the
    batch totals so the all-reduced gradient is the whole batch's, and rank 0 publishes.
    ``optim_version`` >= 0 asks rank 0 to load the policy and its optimizer state at that
    version from the parameter store first (the trainer that held them has left the pool)."""

    step: int
    seqs: list[TrainSeq]
    rank: int = 0
    world: int = 1
    epoch: int = 0
    rendezvous: str = ""
    total_tokens: int = 0  # valid response tokens in the whole batch (0: this shard is all)
    total_seqs: int = 0
    any_signal: bool = True  # some sequence of the whole batch with a loss has a nonzero advantage
    optim_version: int = -1
    # several optimizer updates a step (TrainConfig.mini_batches): this rank's sequences of each
    # mini-batch, in order (``seqs`` is their concatenation), and each whole mini-batch's
    # valid tokens and sequences; empty: one update on the whole batch
    part_sizes: list[int] = []
    part_tokens: list[int] = []
    part_seqs: list[int] = []


class Shutdown(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """Release everything and exit."""

    reason: str = ""


ToWorker = Welcome | Reject | AssignRole | Jobs | AbortJobs | TrainStep | Shutdown


# ---------------------------------------------------------------- launcher <-> worker zygote
# (length-prefixed frames on the zygote's stdin and stdout: launch/zygote_frames.py)


class ForkWorker(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """Fork a worker: ``argv`` as ``python -m pivotflow.worker`` takes it, the whole
    environment it runs with, the file its stdout and stderr go to."""

    worker_id: str
    argv: list[str]
    env: dict[str, str]
    log_path: str


class WorkerForked(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """The worker runs as ``pid``."""

    worker_id: str
    pid: int


class WorkerExited(msgspec.Struct, tag=True, kw_only=True, frozen=True):
    """The worker ended with ``code`` (a signal's: minus its number, as Popen's returncode); pid
    0: the fork itself failed (its log says why)."""

    worker_id: str
    pid: int
    code: int


FromZygote = WorkerForked | WorkerExited
