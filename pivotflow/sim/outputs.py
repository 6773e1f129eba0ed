"""What a simulated job returns: its length, its verdict, and its payload in compact form.

Lengths and verdicts are pure functions of the job's seed, so a migrated sequence ends where it
would have on any worker. Payloads are compact: token ids travel as ``bytes`` (the simulator's
vocabulary has fewer than 256 ids), logprobs and versions as ``array``s. The controller only
measures, decodes, stores and forwards them (``len``, iteration, indexing, ``bytes(ids)`` and
``min`` behave as on lists), and they cost no Python object per token: a 128-GPU hour holds
hundreds of thousands of ~2k-token responses. A fresh sequence's logprobs and versions are
read-only views of one shared run of equal values (every token of it has the same logprob and
version), so they cost no copy either; a resumed one's are arrays.
"""

from __future__ import annotations

import math
from array import array
from statistics import NormalDist

from pivotflow.protocol import GenerateJob, JobDone
from pivotflow.sim.tokens import FILLER, SimTokenizer
from pivotflow.sim.workload import Lengths

_INV_CDF = NormalDist().inv_cdf
_MASK = (1 << 64) - 1
_LOGPROB = -1.0  # the logprob of a simulated token (nothing reads it)


def unit(seed: int, salt: int = 0) -> float:
    """A uniform number in (0, 1), a pure function of ``seed`` and ``salt`` (splitmix64)."""
    z = (seed * 0x9E3779B97F4A7C15 + salt * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return (z + 0.5) / 2.0**64


def response_length(lengths: Lengths, seed: int, max_tokens: int,
                    group: int = 0) -> tuple[int, bool]:
    """Tokens a rollout of ``seed`` generates (log-normal, capped) and whether it stops by EOS
    (False when the cap or ``max_tokens`` cuts it). ``group`` keys what the responses to one
    prompt share (``Lengths.group_share`` of the log-length's variance; none at 0)."""
    z = _INV_CDF(unit(seed))
    if lengths.group_share:
        z = (math.sqrt(lengths.group_share) * _INV_CDF(unit(group, salt=1))
             + math.sqrt(1 - lengths.group_share) * z)
    n = round(math.exp(lengths.sigma * z) * lengths.median)
    cap = min(lengths.cap, max_tokens)
    return (cap, False) if n >= cap else (max(n, 1), True)


class Outputs:
    """Builds ``JobDone`` payloads of filler text for one tokenizer."""

    def __init__(self, tok: SimTokenizer, p_yes: float) -> None:
        self.p_yes = p_yes
        self._fill = bytes(tok.encode(FILLER)[:1])
        self._eos = bytes([tok.eos_id])
        self._yes, self._no = bytes(tok.encode(":Yes")), bytes(tok.encode(":No"))
        self._runs: dict[tuple[str, float], memoryview] = {}  # (typecode, value) -> long run

    def _run(self, typecode: str, value: float, n: int) -> memoryview:
        """A read-only view of ``n`` copies of ``value`` (one shared buffer per value)."""
        run = self._runs.get((typecode, value))
        if run is None or len(run) < n:
            size = max(n, 2 * len(run) if run is not None else 1 << 14)
            run = memoryview(array(typecode, (value,)) * size).toreadonly()
            self._runs[(typecode, value)] = run
        return run[:n]

    def result(
        self, job: GenerateJob, new: int, *, final: bool, stop: bool, judge: bool, version: int
    ) -> JobDone:
        """``job``'s prefix plus ``new`` tokens; on completion (``final``) a judge's ends in its
        verdict and EOS, a rollout's in EOS when it ``stop``s; otherwise an abort's partial."""
        ids = bytes(job.prefix_ids) if job.prefix_ids else b""
        if final and judge:
            verdict = self._yes if unit(job.seed, 1) < self.p_yes else self._no
            ids += self._fill * (new - len(verdict) - 1) + verdict + self._eos
            reason = "stop"
        elif final and stop:
            ids += self._fill * (new - 1) + self._eos
            reason = "stop"
        else:
            ids += self._fill * new
            reason = "length" if final else "abort"
        logprobs: array[float] | memoryview = self._run("d", _LOGPROB, new)
        versions: array[int] | memoryview = self._run("l", version, new)
        if job.prefix_ids:  # a resumed sequence: its earlier tokens first
            logprobs = array("d", job.prefix_logprobs) + array("d", logprobs)
            versions = array("l", job.prefix_versions) + array("l", versions)
        return JobDone(
            job_id=job.job_id,
            token_ids=ids,  # type: ignore[arg-type]  # compact stand-ins (module doc)
            logprobs=logprobs,  # type: ignore[arg-type]
            versions=versions,  # type: ignore[arg-type]
            finish_reason=reason,
        )
