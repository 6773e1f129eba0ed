"""Which groups go into the next optimizer step, so that staleness stays bounded."""

from __future__ import annotations

from pivotflow.controller.sample import Sample

FIRST = "_first_version"  # private key: the policy version a sample's first job was sent at
RETRIED = "_retried"  # private key: the sample's group was refused once (steps now wait for it)
VOID = "_void"  # private key of a sample object whose group was refused while it was in a job


def group_tokens(group: list[Sample]) -> int:
    """Tokens a train step reads for ``group``: prompts and responses, as
    ``train_tokens.seq_tokens`` counts the sequences built from it (before they are built)."""
    return sum(len(s.fields.get("prompt_ids") or ()) + len(s.fields.get("response_ids") or ())
               for s in group)


def oldest_token(group: list[Sample]) -> int | None:
    """The version of the oldest token a group holds (a sequence's first token is its oldest:
    versions never decrease along it), or None before any token."""
    firsts = [v[0] for s in group if (v := s.fields.get("versions"))]
    return min(firsts) if firsts else None


class TrainBuffer:
    """Groups admitted, and groups complete and waiting for the trainer.

    Rule: step ``t`` (trained on policy version ``t``, publishing ``t + 1``) may include a group
    whose staleness base is ``a`` only if ``t - a <= max_staleness``; so a group with
    ``a + max_staleness == t`` must go into step ``t``, and the step waits for it. Admission
    keeps at most ``groups_per_step`` such groups in flight, so a step never needs more.

    The base is the admission version; with ``partial`` (partial rollouts) it is the version
    the group's first job was sent at (``started``), which its oldest token cannot predate
    (that job asks for weights at least that new): a group still queued holds no token, so no
    step waits for it, and ``max_staleness`` bounds the oldest token a trained sample holds.
    ``refuse`` takes out the complete groups holding a token older than that bound (their
    tokens are thrown away and they are generated again; see Controller.regenerate).
    """

    def __init__(self, groups_per_step: int, max_staleness: int, partial: bool = False,
                 skip_tail: bool = False) -> None:
        self.n = groups_per_step
        self.s = max_staleness
        self.partial = partial
        # over-sampling: a step waits for no due group but a retried one (the rest of the due
        # groups are refused at the boundary: the tail is cut, each group once)
        self.skip_tail = skip_tail
        self.retried: set[int] = set()
        self.open: dict[int, int] = {}  # group_id -> admit version, until trained or dropped
        self.first: dict[int, int] = {}  # partial only: group_id -> version its first job went
        self.ready: dict[int, list[Sample]] = {}
        self.ready_samples = 0  # samples in ``ready`` (the planner asks every interval)
        self.ready_tokens = 0  # their tokens, prompt and response (the planner's step length)

    def admitted(self, group_id: int, version: int) -> None:
        self.open[group_id] = version

    def started(self, group_id: int, version: int) -> None:
        """A job of the group was sent at ``version`` (kept only for its first)."""
        self.first.setdefault(group_id, version)

    def dropped(self, group_id: int) -> None:
        self.open.pop(group_id, None)
        self.first.pop(group_id, None)
        self.retried.discard(group_id)

    def retry(self, group_id: int) -> None:
        """A refused group is generated again from its prompt: its first job is yet to go, and
        steps wait for it now (it is cut once)."""
        self.first.pop(group_id, None)
        self.retried.add(group_id)

    def restore(self, open_groups: dict[int, int], firsts: dict[int, int],
                retried: set[int]) -> None:
        """A snapshot's open groups (id -> admit version), and of those, the version each one's
        first job went out at and the ones generated again (partial rollouts)."""
        self.open = dict(open_groups)
        self.first.update({g: v for g, v in firsts.items() if g in self.open})
        self.retried.update(g for g in retried if g in self.open)

    def add(self, group: list[Sample]) -> None:
        self.ready[group[0].group_id] = group
        self.ready_samples += len(group)
        self.ready_tokens += group_tokens(group)

    def _must(self, version: int) -> list[int]:
        """The groups step ``version`` has to include (it waits for them)."""
        if not self.partial:
            return [g for g, a in self.open.items() if a + self.s <= version]
        due = sorted((f, g) for g, f in self.first.items() if f + self.s <= version
                     and (not self.skip_tail or g in self.retried))
        return [g for _, g in due[: self.n]]  # more than a step holds: refused next step

    def can_take(self, version: int) -> bool:
        """Whether ``take(version)`` would return a batch now."""
        if len(self.ready) < self.n:
            return False
        return all(g in self.ready for g in self._must(version))

    def take(self, version: int) -> list[list[Sample]] | None:
        """The next step's groups, oldest first, or None while the step must wait."""
        if len(self.ready) < self.n:
            return None
        must = self._must(version)
        if any(g not in self.ready for g in must):
            return None
        chosen = sorted(must)
        taken = set(chosen)
        if self.partial:  # the oldest tokens first: the least staleness
            aged = sorted((self.first.get(g, version), g) for g in self.ready if g not in taken)
            chosen += [g for _, g in aged[: max(0, self.n - len(chosen))]]
        else:
            rest = sorted(g for g in self.ready if g not in taken)
            chosen += rest[: max(0, self.n - len(chosen))]
        batch = [self.ready.pop(g) for g in chosen]
        self.ready_samples -= sum(map(len, batch))
        self.ready_tokens -= sum(map(group_tokens, batch))
        for g in chosen:
            self.open.pop(g, None)
            self.first.pop(g, None)
            self.retried.discard(g)
        return batch

    def stale(self, version: int) -> list[int]:
        """Open groups that started too early for any step from ``version`` on."""
        return [g for g, f in self.first.items() if f + self.s < version]

    def refuse(self, version: int) -> list[list[Sample]]:
        """Partial rollouts: take out the complete groups that no step from ``version`` on may
        train (a token older than ``version - max_staleness``); they stay open."""
        if not self.partial:
            return []
        out = []
        for g in [g for g, group in self.ready.items()
                  if (o := oldest_token(group)) is not None and o + self.s < version]:
            group = self.ready.pop(g)
            self.ready_samples -= len(group)
            self.ready_tokens -= group_tokens(group)
            self.first.pop(g, None)
            out.append(group)
        return out

    def requeue(self, batch: list[list[Sample]]) -> None:
        """Put a batch whose step failed back, as if it had never been taken."""
        for group in batch:
            self.open[group[0].group_id] = group[0].admit_version
            self.restarted(group)
            self.ready[group[0].group_id] = group
            self.ready_samples += len(group)
            self.ready_tokens += group_tokens(group)

    def restarted(self, group: list[Sample]) -> None:
        """A group back in the controller (a step undone, a resume): its first job's version
        comes from its samples."""
        firsts = [f for s in group if (f := s.private.get(FIRST)) is not None]
        if self.partial and firsts:
            self.first[group[0].group_id] = min(firsts)

    def in_flight(self) -> int:
        return len(self.open)
