"""The one exception tree of reins.

Everything reins raises on purpose derives from :class:`ReinsError`. Two branches matter to
callers: :class:`InvalidInput` (bad input; nothing was changed, fix the input and try again)
and :class:`ControlFlow` (an expected refusal the caller must handle: a lost race, an illegal
edge, a budget that does not fit). Infrastructure failures sit under :class:`StoreError`.

Every error carries a ``code`` (its class's, or a narrower one given where it is raised) and,
for bad input, the ``field`` at fault when one is: callers map codes and fields, never the
message text, which is for people.
"""

from __future__ import annotations


class ReinsError(Exception):
    """Root of every error reins raises on purpose."""

    code: str = "error"

    def __init__(self, *args: object, code: str | None = None, field: str | None = None) -> None:
        super().__init__(*args)
        self.field = field
        if code is not None:
            self.code = code  # a narrower code for this one


# --- bad input: refused, nothing changed -------------------------------------------------


class InvalidInput(ReinsError):
    """Input that reins refuses; the message names what was wrong and nothing was changed."""

    code = "invalid_input"


class ConfigError(InvalidInput):
    """A setting or configuration value that cannot be used; the message names the variable."""

    code = "config_error"


class InvalidBudget(InvalidInput):
    """A budget vector that violates its own rules (negative value, zero deadline, reserve)."""

    code = "invalid_budget"

    def __init__(self, *args: object, code: str | None = None, field: str | None = "budget"):
        super().__init__(*args, code=code, field=field)


class UnknownTenant(InvalidInput):
    """A tenant that is not in the tenant configuration."""

    code = "unknown_tenant"


class SubmissionRefused(InvalidInput):
    """A job refused at submission (over a tenant limit, unknown agent, oversized call)."""

    code = "submission_refused"


class UnknownAgent(InvalidInput):
    """An agent reference (MODULE:AGENT) that cannot be loaded, or that a tenant may not run."""

    code = "unknown_agent"

    def __init__(self, *args: object, code: str | None = None, field: str | None = "agent"):
        super().__init__(*args, code=code, field=field)


# --- control flow: expected refusals the caller must handle -------------------------------


class ControlFlow(ReinsError):
    """An expected refusal: the caller lost a race, asked for an illegal edge, or ran out."""

    code = "control_flow"


class IllegalTransition(ControlFlow):
    """An edge that is not in the lifecycle table, or whose guard refused it."""

    code = "illegal_transition"

    def __init__(self, source: str, target: str, decision_id: str, why: str = "") -> None:
        self.source, self.target, self.decision_id, self.why = source, target, decision_id, why
        detail = f": {why}" if why else ""
        super().__init__(f"illegal transition {source} -> {target} for {decision_id}{detail}")


class StaleDecision(ControlFlow):
    """A decision formed on a record_version that has since changed."""

    code = "stale_decision"

    def __init__(self, decision_id: str, seen_version: int, current_version: int) -> None:
        self.decision_id = decision_id
        self.seen_version, self.current_version = seen_version, current_version
        super().__init__(
            f"stale decision {decision_id}: made on version {seen_version}, "
            f"record is at version {current_version}"
        )


class AdmissionRefused(ControlFlow):
    """Bounded-liability admission refused an operation: it does not fit in some dimension."""

    code = "admission_refused"

    def __init__(self, dimension: str, needed: object, headroom: object) -> None:
        self.dimension, self.needed, self.headroom = dimension, needed, headroom
        super().__init__(
            f"admission refused on {dimension}: liability {needed} exceeds headroom {headroom}"
        )


class ConcurrentModification(ControlFlow):
    """A compare-and-set lost: another writer committed the version this one expected."""

    code = "concurrent_modification"

    def __init__(self, trajectory_id: str, expected_version: int, current_version: int) -> None:
        self.trajectory_id = trajectory_id
        self.expected_version, self.current_version = expected_version, current_version
        super().__init__(
            f"trajectory {trajectory_id}: expected version {expected_version}, "
            f"store holds version {current_version}"
        )


class UnknownReference(ControlFlow):
    """An event names a trajectory, operation, attempt, epoch or approval that does not match."""

    code = "unknown_reference"


# --- infrastructure ---------------------------------------------------------------------------


class StoreError(ReinsError):
    """The store could not do what was asked (unreachable, corrupt data)."""

    code = "store_error"


class SnapshotNotFound(StoreError):
    """No snapshot exists for this trajectory (in this tenant)."""

    code = "not_found"


class CorruptSnapshot(StoreError):
    """A stored snapshot fails validation on load; it is never overwritten."""

    code = "corrupt_snapshot"


class RingError(InvalidInput):
    """A placement request the ring cannot serve (empty ring, unknown or duplicate member)."""

    code = "ring_error"


class UnsupportedSchema(InvalidInput):
    """A record whose schema version this build does not know; it is left as it is."""

    code = "unsupported_schema"


class StaleNomination(ControlFlow):
    """An admitter nomination whose call left the head of its queue or no longer fits its credit."""

    code = "stale_nomination"


class EmptyRing(RingError):
    """A lookup on a ring with no member that may take new placements (none, or all draining)."""

    code = "empty_ring"


class DuplicateMember(RingError):
    """A member added to a ring that already holds a member of that name."""

    code = "duplicate_member"


class UnknownMember(RingError):
    """A member named in a ring or membership operation that is not there."""

    code = "unknown_member"


class InvalidWeight(RingError):
    """A member weight that is not a finite positive number."""

    code = "invalid_weight"


class InvalidMemberName(RingError):
    """A member name that is empty, too long, or holds whitespace or unprintable characters."""

    code = "invalid_member_name"


class SnapshotExists(ConcurrentModification):
    """A create lost: this tenant already holds a snapshot with this trajectory id."""

    code = "already_exists"

    def __init__(self, trajectory_id: str, current_version: int) -> None:
        super().__init__(trajectory_id, 0, current_version)
        self.args = (f"trajectory {trajectory_id} already exists (at version {current_version})",)


class StoreUnavailable(StoreError):
    """The store stayed unreachable through bounded retries; the message says what is unknown."""

    code = "store_unavailable"


class UnsupportedLayout(StoreError):
    """The Redis store's keys are in a layout this build does not read; nothing is written."""

    code = "unsupported_layout"


class ClaimLapsed(StaleNomination):
    """A Redis admitter claim that is no longer pending: withdrawn, or reaped with its quota."""

    code = "claim_lapsed"
