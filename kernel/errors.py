"""The one exception tree of reins.

Everything reins raises on purpose derives from :class:`ReinsError`. Two branches matter to
callers: :class:`InvalidInput` (bad input; nothing was changed, fix the input and try again)
and :class:`ControlFlow` (an expected refusal the caller must handle: a lost race, an illegal
edge, a budget that does not fit). Infrastructure failures sit under :class:`StoreError`.
"""

from __future__ import annotations


class ReinsError(Exception):
    """Root of every error reins raises on purpose."""


# --- bad input: refused, nothing changed -------------------------------------------------


class InvalidInput(ReinsError):
    """Input that reins refuses; the message names what was wrong and nothing was changed."""


class ConfigError(InvalidInput):
    """A setting or configuration value that cannot be used; the message names the variable."""


class InvalidBudget(InvalidInput):
    """A budget vector that violates its own rules (negative value, zero deadline, reserve)."""


class UnknownTenant(InvalidInput):
    """A tenant that is not in the tenant configuration."""


class SubmissionRefused(InvalidInput):
    """A job refused at submission (over a tenant limit, unknown agent, oversized call)."""


class UnknownAgent(InvalidInput):
    """An agent reference (MODULE:AGENT) that cannot be loaded."""


# --- control flow: expected refusals the caller must handle -------------------------------


class ControlFlow(ReinsError):
    """An expected refusal: the caller lost a race, asked for an illegal edge, or ran out."""


class IllegalTransition(ControlFlow):
    """An edge that is not in the lifecycle table, or whose guard refused it."""

    def __init__(self, source: str, target: str, decision_id: str, why: str = "") -> None:
        self.source, self.target, self.decision_id, self.why = source, target, decision_id, why
        detail = f": {why}" if why else ""
        super().__init__(f"illegal transition {source} -> {target} for {decision_id}{detail}")


class StaleDecision(ControlFlow):
    """A decision formed on a record_version that has since changed."""

    def __init__(self, decision_id: str, seen_version: int, current_version: int) -> None:
        self.decision_id = decision_id
        self.seen_version, self.current_version = seen_version, current_version
        super().__init__(
            f"stale decision {decision_id}: made on version {seen_version}, "
            f"record is at version {current_version}"
        )


class AdmissionRefused(ControlFlow):
    """Bounded-liability admission refused an operation: it does not fit in some dimension."""

    def __init__(self, dimension: str, needed: object, headroom: object) -> None:
        self.dimension, self.needed, self.headroom = dimension, needed, headroom
        super().__init__(
            f"admission refused on {dimension}: liability {needed} exceeds headroom {headroom}"
        )


class ConcurrentModification(ControlFlow):
    """A compare-and-set lost: another writer committed the version this one expected."""

    def __init__(self, trajectory_id: str, expected_version: int, current_version: int) -> None:
        self.trajectory_id = trajectory_id
        self.expected_version, self.current_version = expected_version, current_version
        super().__init__(
            f"trajectory {trajectory_id}: expected version {expected_version}, "
            f"store holds version {current_version}"
        )


class UnknownReference(ControlFlow):
    """An event names a trajectory, operation, attempt, epoch or approval that does not match."""


# --- infrastructure ---------------------------------------------------------------------------


class StoreError(ReinsError):
    """The store could not do what was asked (unreachable, corrupt data)."""


class SnapshotNotFound(StoreError):
    """No snapshot exists for this trajectory (in this tenant)."""


class CorruptSnapshot(StoreError):
    """A stored snapshot fails validation on load; it is never overwritten."""


class RingError(InvalidInput):
    """A placement request the ring cannot serve (empty ring, unknown or duplicate member)."""


class UnsupportedSchema(InvalidInput):
    """A record whose schema version this build does not know; it is left as it is."""


class StaleNomination(ControlFlow):
    """An admitter nomination whose call left the head of its queue or no longer fits its credit."""


class EmptyRing(RingError):
    """A lookup on a ring with no member that may take new placements (none, or all draining)."""


class DuplicateMember(RingError):
    """A member added to a ring that already holds a member of that name."""


class UnknownMember(RingError):
    """A member named in a ring or membership operation that is not there."""


class InvalidWeight(RingError):
    """A member weight that is not a finite positive number."""


class InvalidMemberName(RingError):
    """A member name that is empty, too long, or holds whitespace or unprintable characters."""


class SnapshotExists(ConcurrentModification):
    """A create lost: this tenant already holds a snapshot with this trajectory id."""

    def __init__(self, trajectory_id: str, current_version: int) -> None:
        super().__init__(trajectory_id, 0, current_version)
        self.args = (f"trajectory {trajectory_id} already exists (at version {current_version})",)


class StoreUnavailable(StoreError):
    """The store stayed unreachable through bounded retries; the message says what is unknown."""


class UnsupportedLayout(StoreError):
    """The Redis store's keys are in a layout this build does not read; nothing is written."""


class ClaimLapsed(StaleNomination):
    """A Redis admitter claim that is no longer pending: withdrawn, or reaped with its quota."""
