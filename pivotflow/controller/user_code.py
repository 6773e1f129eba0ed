"""Running the graph's own Python (map, group, filter functions, a judge's template and parse)
so that it fails cleanly: an exception, a value of the wrong type or a non-finite number, or a
call that runs past the stage's deadline becomes a :class:`StageError` naming the stage, the
graph file's line and the sample; the stage's ``on_error`` says whether that stops the run or
drops the sample's group (counted as skipped, settled like a filtered group: never lost).

How a deadline holds: user code may hang (a ``time.sleep``, a judge parser stuck in a loop).
On the main thread (where the controller's loop runs) the function runs inline, and a watchdog
thread that looks every 50 ms sends the loop thread SIGUSR2 once the call is past its
deadline; the handler raises ``_DeadlineExceeded`` (a BaseException: a user's ``except
Exception`` cannot swallow it) in the call, which interrupts even a blocking sleep (EINTR).
Per call that costs two clock reads (~0.5 us in all; a thread hop per call measured 74 us,
several times the controller's whole per-sample cost). Off the main thread, where no signal
handler can be set, the call runs on a daemon thread that the caller waits for at most the
deadline (abandoned if it hangs: a thread cannot be killed). A process pool would isolate
user code fully but costs a pickle round trip per sample and cannot run closures defined in a
graph file. ``deadline_s=None`` runs the function inline with no deadline.

An ``async def`` function (any call that returns an awaitable) is awaited instead, as a task of
the controller's loop (``async_calls.py``), so the run goes on while it waits on a server:
:func:`awaited` holds it to the same deadline, from the call to its result, with
``asyncio.timeout``, and on the main thread sets the watchdog's deadline while each of its
steps runs, so an ``async def`` that blocks (a ``time.sleep``, a loop) is interrupted too.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
import queue
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any

from pivotflow.controller.sample import Sample, held_out
from pivotflow.errors import StageError
from pivotflow.stage_options import DEFAULT_DEADLINE_S

if TYPE_CHECKING:
    from pivotflow.controller.core import Controller
    from pivotflow.graph import Node

log = logging.getLogger("pivotflow.controller")

NUMERIC_FIELDS = frozenset({"reward", "advantage"})  # the RL math reads these as numbers
# ... or, these, as one number per response token (GAE's advantages and value targets)
PER_TOKEN_FIELDS = frozenset({"advantage", "returns"})


class _Runner:
    """One daemon thread that runs the calls put on its queue, one at a time."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="pivotflow-stage-fn", daemon=True).start()

    def _serve(self) -> None:
        while (call := self.calls.get()) is not None:
            fn, kwargs, box, done = call
            try:
                box.append((True, fn(**kwargs)))
            except BaseException as exc:  # handed back to the loop thread, raised there
                box.append((False, exc))
            done.set()


_runner: _Runner | None = None  # only the loop thread touches it


class _DeadlineExceeded(BaseException):
    """Raised inside a user function that ran past its stage's deadline."""


class _Watchdog:
    """Deadlines for calls made inline on the main thread (see the module's docstring)."""

    POLL_S = 0.05

    def __init__(self) -> None:
        self.deadline: float | None = None  # monotonic time the current call must end by
        self.main = threading.main_thread().ident or 0
        signal.signal(signal.SIGUSR2, self._on_signal)
        threading.Thread(target=self._watch, name="pivotflow-stage-deadline", daemon=True).start()

    def _watch(self) -> None:
        while True:
            time.sleep(self.POLL_S)
            due = self.deadline
            if due is not None and time.monotonic() > due:
                signal.pthread_kill(self.main, signal.SIGUSR2)
                time.sleep(self.POLL_S)  # once per poll at most, until the call ends

    def _on_signal(self, signum: int, frame: object) -> None:
        due = self.deadline  # the call running now: raise only if *its* deadline passed
        if due is not None and time.monotonic() > due:
            self.deadline = None
            raise _DeadlineExceeded

    def run(self, fn: Callable[..., Any], kwargs: dict[str, Any], deadline_s: float) -> Any:
        self.deadline = time.monotonic() + deadline_s
        try:
            return fn(**kwargs)
        finally:
            self.deadline = None


_watchdog: _Watchdog | None = None  # made on the first call on the main thread


def _one_line(text: object, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def stage_error(node: Node, samples: list[Sample], what: str) -> StageError:
    first = samples[0]
    who = (f"sample {first.sample_id} (group {first.group_id})" if len(samples) == 1
           else f"group {first.group_id} ({len(samples)} samples)")
    return StageError(f"{node.kind} {node.name!r} at {node.where} on {who}: {what}",
                      stage=node.name, group_id=first.group_id,
                      on_error=node.options.get("on_error", "stop"))


def call(node: Node, role: str, fn: Callable[..., Any], kwargs: dict[str, Any],
         samples: list[Sample], *, awaitable: bool = False) -> Any:
    """``fn(**kwargs)`` under the stage's deadline; any failure is a StageError. An awaitable
    it returns (an ``async def``'s call) is handed back with ``awaitable`` (a map, group or
    filter function: the caller awaits it with :func:`awaited`), else an error."""
    out = _call(node, role, fn, kwargs, samples)
    if inspect.isawaitable(out) and not awaitable:
        discard(out)
        raise stage_error(node, samples, f"{role} returned an awaitable ({type(out).__name__}):"
                                         " only map, group and filter functions may be async")
    return out


def discard(pending: Awaitable[Any]) -> None:
    """Drop an awaitable a stage function returned that will never be awaited: a coroutine is
    closed, so it leaves no "was never awaited" warning behind."""
    if inspect.iscoroutine(pending):
        pending.close()


def _call(node: Node, role: str, fn: Callable[..., Any], kwargs: dict[str, Any],
          samples: list[Sample]) -> Any:
    global _runner
    deadline = node.options.get("deadline_s", DEFAULT_DEADLINE_S)
    if deadline is None:
        try:
            return fn(**kwargs)
        except Exception as exc:
            raise stage_error(node, samples, f"{role} raised {type(exc).__name__}: "
                                             f"{_one_line(exc)}") from exc
    if threading.current_thread() is threading.main_thread():
        global _watchdog
        if _watchdog is None:
            _watchdog = _Watchdog()
        try:
            return _watchdog.run(fn, kwargs, deadline)
        except _DeadlineExceeded:
            raise stage_error(node, samples, f"{role} ran longer than its deadline_s={deadline} "
                                             "(set deadline_s= on the stage to allow more)"
                              ) from None
        except Exception as exc:
            raise stage_error(node, samples, f"{role} raised {type(exc).__name__}: "
                                             f"{_one_line(exc)}") from exc
    if _runner is None:
        _runner = _Runner()
    box: list[tuple[bool, Any]] = []
    done = threading.Event()
    _runner.calls.put((fn, kwargs, box, done))
    if not done.wait(deadline):
        hung, _runner = _runner, None
        hung.calls.put(None)  # it ends once the hung call returns, if ever
        raise stage_error(node, samples, f"{role} ran longer than its deadline_s={deadline} "
                                         "(set deadline_s= on the stage to allow more)")
    ok, value = box[0]
    if not ok:
        if not isinstance(value, Exception):  # KeyboardInterrupt, SystemExit: not ours
            raise value
        raise stage_error(node, samples, f"{role} raised {type(value).__name__}: "
                                         f"{_one_line(value)}") from value
    return value


class _Stepped:
    """Awaits ``inner`` one step at a time with the watchdog's deadline set while each step
    runs on the loop thread, and unset while the loop serves the rest of the run."""

    def __init__(self, inner: Awaitable[Any], watchdog: _Watchdog, due: float) -> None:
        self.inner, self.watchdog, self.due = inner, watchdog, due

    def __await__(self) -> Generator[Any, Any, Any]:
        steps = self.inner.__await__()
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            self.watchdog.deadline = self.due
            try:
                yielded = steps.send(sent) if thrown is None else steps.throw(thrown)
            except StopIteration as stop:
                return stop.value
            finally:
                self.watchdog.deadline = None
            try:
                sent, thrown = (yield yielded), None
            except BaseException as exc:  # the loop's cancellation, handed on to the call
                sent, thrown = None, exc


async def awaited(node: Node, role: str, pending: Awaitable[Any], samples: list[Sample]) -> Any:
    """What an ``async def`` stage function's call returns, awaited under the stage's deadline
    (from now); any failure is a StageError, as for :func:`call`."""
    global _watchdog
    deadline = node.options.get("deadline_s", DEFAULT_DEADLINE_S)
    late = (f"{role} ran longer than its deadline_s={deadline} (set deadline_s= on the stage "
            "to allow more)")
    if deadline is not None and threading.current_thread() is threading.main_thread():
        if _watchdog is None:
            _watchdog = _Watchdog()
        pending = _Stepped(pending, _watchdog, time.monotonic() + deadline)
    timer = asyncio.timeout(deadline)
    try:
        async with timer:
            return await pending
    except _DeadlineExceeded:
        raise stage_error(node, samples, late) from None
    except Exception as exc:
        if isinstance(exc, TimeoutError) and timer.expired():  # (not the function's own)
            raise stage_error(node, samples, late) from None
        raise stage_error(node, samples, f"{role} raised {type(exc).__name__}: "
                                         f"{_one_line(exc)}") from exc


def check_value(node: Node, samples: list[Sample], key: str, value: Any) -> None:
    """A written field's value: RL numbers must be real numbers (``reward`` may be None, a
    failed judgement) and no float may be NaN or infinite; ``advantage`` and ``returns`` may
    be lists of them, one per response token of the sample."""
    if key in PER_TOKEN_FIELDS and isinstance(value, (list, tuple)):
        _check_per_token(node, samples, key, value)
        return
    if (key in NUMERIC_FIELDS and not (value is None and key == "reward")
            and not isinstance(value, numbers.Real)):  # (numpy's scalars are Real too)
        raise stage_error(node, samples, f"returned {key}={_one_line(repr(value), 60)} of "
                                         f"type {type(value).__name__}, expected a number")
    if (isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)
            and not math.isfinite(value)):
        raise stage_error(node, samples, f"returned a non-finite {key}={value!r}")


def _check_per_token(node: Node, samples: list[Sample], key: str, value: Any) -> None:
    """One finite number per response token of the (one) sample it was written for."""
    bad = next((v for v in value if isinstance(v, bool) or not isinstance(v, numbers.Real)
                or not math.isfinite(v)), None)
    if bad is not None:
        raise stage_error(node, samples, f"returned a {key} list holding "
                                         f"{_one_line(repr(bad), 60)}, expected finite numbers")
    tokens = len(samples[0].fields.get("response_ids") or ()) if len(samples) == 1 else None
    if tokens is not None and len(value) != tokens:
        raise stage_error(node, samples, f"returned {len(value)} {key} values for "
                                         f"{tokens} response tokens (one per token)")


def guard(ctl: Controller, stage: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
    """Run a stage step (stages.py); ``(True, its value)``, or ``(False, None)`` when it
    failed on a stage with ``on_error=skip`` and its group was dropped. A failure on a stage
    that stops raises, and the controller stops the run with it (its traceback in the log)."""
    try:
        return True, stage(*args)
    except StageError as exc:
        if exc.on_error != "skip":
            raise
        skip_group(ctl, exc)
        return False, None


def skip_group(ctl: Controller, exc: StageError) -> None:
    """Drop a group whose stage function failed: settled as skipped (its other samples, still
    queued or generating, are dropped when they come back), so it is neither lost nor trained."""
    log.error("skipped a group (on_error=skip): %s", exc, exc_info=exc)
    gid = exc.group_id
    if held_out(gid):  # an evaluation sample (controller/evaluation.py): the round counts it
        assert ctl.evaluation is not None
        ctl.evaluation.drop(ctl, gid)
        return
    if ctl.ledger.settled(gid):
        return  # another sample of it failed first
    # counted with the filtered: a stage that fails on everything must not spin forever
    dropped, limit = ctl.drop_group(gid, filtered=False)
    if dropped > limit:
        ctl.fail(StageError(f"{exc} -- and {dropped} groups were filtered or "
                            f"skipped since the last optimizer step (limit {limit}): nothing "
                            "is left to train on", stage=exc.stage, group_id=gid,
                            on_error="stop"))
