"""Crash recovery: which member holds which turn, and recovering a lapsed member's turns.

:class:`Holdings`: a router records each turn in its member's holdings before it sends the
message; the worker releases it after pushing the turn's notice (a release names its version,
so a late one never drops a newer holding). Keys (one hash tag for the two-key scripts)::

    {P:held}:m:<member>   hash   "<tenant>/<trajectory>" -> "<version>:<epoch>:<call id>"
    {P:held}:members      set    the members that hold (or held) turns
    P:fleet:recoveries    list   one JSON entry per recovery (member, trajectory, seconds from
                                 the last heartbeat, router)

:class:`Reconciler`, at each router tick: for every lapsed holder already out of the ring, take
each holding (only one router wins it) and deliver ``Recover`` by compare-and-set while the
record is still in the sent turn. Design: ``docs/adr/0008-turn-recovery.md``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from kernel.errors import ReinsError
from kernel.record import OpKind, TrajectoryRecord
from kernel.states import LifecycleState
from router.feed import TurnMessage
from router.membership import MemberRecord, Membership
from router.ring import Ring
from router.stranded import ACTING, StrandedTurns
from router.submit import RouterApi
from store.redis_client import Batch, direct_batch, retry_transient, script_reply, text

log = logging.getLogger("reins.router.reconcile")
RECOVERIES_CAP = 100_000

# Delete field ARGV[1] of hash KEYS[1] if its value's version (the text before the first ':')
# is ARGV[2] (mode "version", a worker's release) or the value is exactly ARGV[2] ("exact", a
# reconciler's take). Returns 1 when it deleted.
_RELEASE = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
if ARGV[3] == 'exact' then
  if v ~= ARGV[2] then return 0 end
elseif string.sub(v, 1, string.len(ARGV[2]) + 1) ~= ARGV[2] .. ':' then
  return 0
end
return redis.call('HDEL', KEYS[1], ARGV[1])
"""
# Forget member ARGV[1] (set KEYS[1]) when its holdings hash KEYS[2] is empty.
_FORGET = """
if redis.call('HLEN', KEYS[2]) == 0 then return redis.call('SREM', KEYS[1], ARGV[1]) end
return 0
"""


@dataclass(frozen=True, slots=True)
class Held:
    """One turn a member holds: where the record was when its message was sent."""

    tenant: str
    trajectory_id: str
    version: int
    epoch: int
    call_id: str
    raw: str

    @classmethod
    def parse(cls, key: str, raw: str) -> Held:
        tenant, _, tid = key.partition("/")
        version, epoch, call_id = raw.split(":", 2)
        return cls(tenant, tid, int(version), int(epoch), call_id, raw)


def _holding(member: str, payload: dict[str, Any]) -> tuple[str, str, str]:
    """(member, field, value) of the holding of turn message ``payload`` sent to ``member``."""
    commands = payload.get("commands") or [{}]
    return _holding_of(
        member,
        f"{payload['tenant']}/{payload['trajectory_id']}",
        int(payload["version"]),
        int(payload["epoch"]),
        str(commands[0].get("call_id", "")),
    )


def _holding_of(
    member: str, key: str, version: int, epoch: int, call_id: str
) -> tuple[str, str, str]:
    return member, key, f"{version}:{epoch}:{call_id}"


class Holdings:
    """Which member holds which turn (see the module docstring)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.tag = f"{{{prefix}:held}}"
        self.members_key = f"{self.tag}:members"
        self.recoveries_key = f"{prefix}:fleet:recoveries"
        self._release = client.register_script(_RELEASE)
        self._forget = client.register_script(_FORGET)
        self._pending: list[tuple[str, str, str]] = []

    def key(self, member: str) -> str:
        return f"{self.tag}:m:{member}"

    # --- the router's side -------------------------------------------------------------------

    def note(self, member: str, payload: dict[str, Any]) -> None:
        """Buffer the holding of the turn message ``payload`` sent to ``member``."""
        self._pending.append(_holding(member, payload))

    def flush(self) -> None:
        """Write the buffered holdings (one round trip); call before the messages are sent."""
        pending, self._pending = self._pending, []
        if not pending:
            return

        def write() -> None:  # idempotent: retried as a whole
            pipe = direct_batch(self.client)
            self._write_on(pipe, pending)
            pipe.execute()

        try:
            retry_transient(write, what="writing the holdings", attempts=4, counted=4)
        except ReinsError:
            self._pending = pending + self._pending  # written before anything is sent
            raise

    def commands(self, member: str, msg: TurnMessage) -> list[tuple[str, ...]]:
        """The commands that write the holding of turn message ``msg`` for ``member``, for a
        member that admits a turn itself to send before its admission commits
        (:mod:`worker.chain`); idempotent, as a resend after a lost reply needs. Read from the
        message's fields: its payload would dump the model's whole view."""
        call_id = msg.commands[0].call_id if msg.commands else ""
        key = f"{msg.tenant}/{msg.trajectory_id}"
        return self._commands([_holding_of(member, key, msg.version, msg.epoch, call_id)])

    def _write_on(self, pipeline: Batch, pending: list[tuple[str, str, str]]) -> None:
        for command in self._commands(pending):
            pipeline.execute_command(*command)

    def _commands(self, pending: list[tuple[str, str, str]]) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = [
            ("HSET", self.key(member), field_, value) for member, field_, value in pending
        ]
        out.append(("SADD", self.members_key, *sorted({m for m, _, _ in pending})))
        return out

    def sending(self, inner: Callable[[str, dict[str, Any]], None]) -> Callable[..., None]:
        """A sender that records each holding, then sends through ``inner`` at once."""

        def send(member: str, payload: dict[str, Any]) -> None:
            self.note(member, payload)
            self.flush()
            inner(member, payload)

        return send

    def buffering(self, inner: Callable[[str, dict[str, Any]], None]) -> Callable[..., None]:
        """A sender that buffers each holding (:meth:`flush` before ``inner``'s own flush)."""

        def send(member: str, payload: dict[str, Any]) -> None:
            self.note(member, payload)
            inner(member, payload)

        return send

    # --- the worker's side -------------------------------------------------------------------

    def release(
        self,
        member: str,
        tenant: str,
        trajectory_id: str,
        version: int,
        pipeline: Batch | None = None,
    ) -> bool:
        """The turn sent at ``version`` ended on ``member`` (its notice is pushed). True when
        a holding was deleted; with ``pipeline`` the release is only queued on it (False), as a
        bare ``EVALSHA``: a script object would make redis-py ask ``SCRIPT EXISTS`` before
        every pipeline, a round trip per turn. Pass the pipeline's reply to
        :meth:`released_on` to finish it."""
        args = [f"{tenant}/{trajectory_id}", str(version), "version"]
        if pipeline is not None:
            pipeline.execute_command("EVALSHA", self._release.sha, 1, self.key(member), *args)
            return False
        return bool(self._release(keys=[self.key(member)], args=args))

    def released_on(
        self, reply: Any, member: str, tenant: str, trajectory_id: str, version: int
    ) -> bool:
        """Finish a release queued on a pipeline from its ``reply`` (executed with
        ``raise_on_error=False``; :func:`~store.redis_store.script_reply`)."""
        return bool(
            script_reply(reply, lambda: self.release(member, tenant, trajectory_id, version))
        )

    # --- the reconciler's side ---------------------------------------------------------------

    def holders(self) -> set[str]:
        raw = cast(set[bytes], self.client.smembers(self.members_key))
        return {text(m) for m in raw}

    def held(self, member: str) -> list[Held]:
        raw = cast(dict[bytes, bytes], self.client.hgetall(self.key(member)))
        out = []
        for k, v in raw.items():
            try:
                out.append(Held.parse(text(k), text(v)))
            except ValueError:
                log.warning("bad holding %r=%r of %s dropped", k, v, member)
                self.client.hdel(self.key(member), k)
        return sorted(out, key=lambda h: (h.tenant, h.trajectory_id))

    def take(self, member: str, held: Held) -> bool:
        """Claim the recovery of ``held``: True for exactly one caller."""
        args = [f"{held.tenant}/{held.trajectory_id}", held.raw, "exact"]
        return bool(self._release(keys=[self.key(member)], args=args))

    def forget(self, member: str) -> bool:
        """Drop ``member`` from the holders once it holds nothing."""
        return bool(self._forget(keys=[self.members_key, self.key(member)], args=[member]))

    def record_recoveries(self, entries: Sequence[dict[str, Any]]) -> None:
        if entries:
            pipe = self.client.pipeline(transaction=False)
            pipe.rpush(self.recoveries_key, *(json.dumps(e) for e in entries))
            pipe.ltrim(self.recoveries_key, -RECOVERIES_CAP, -1)
            pipe.execute()

    def recoveries(self) -> list[dict[str, Any]]:
        """Every recovery recorded, oldest first (the figure of time to recovery)."""
        raw = cast(list[bytes], self.client.lrange(self.recoveries_key, 0, -1))
        return [json.loads(r) for r in raw]

    def redis_now(self) -> float:
        seconds, micros = self.client.time()
        return float(seconds) + micros / 1_000_000


@dataclass
class Reconciler:
    """Recovers the turns of lapsed members (see the module docstring); one per router."""

    api: RouterApi
    membership: Membership
    holdings: Holdings
    ring: Callable[[], Ring]
    by: str
    backstop: StrandedTurns | None = None
    recovered: int = 0
    figures: list[float] = field(default_factory=list)  # seconds from last heartbeat

    def tick(self) -> list[str]:
        """One pass over the lapsed holders; returns the trajectories recovered."""
        out = self._lapsed()
        if self.backstop is not None:
            out += self.backstop.sweep()
        return out

    def _lapsed(self) -> list[str]:
        holders = self.holdings.holders()
        if not holders:
            return []
        records = {r.name: r for r in self.membership.records()}
        dead = self._dead(holders, records)
        if not dead:
            return []
        entries: list[dict[str, Any]] = []
        for member in dead:
            entries += self._recover_member(member, records.get(member))
        self.holdings.record_recoveries(entries)
        out = [e["trajectory_id"] for e in entries]
        self.recovered += len(out)
        if out:
            worst = max((e["since_heartbeat_s"] or 0.0) for e in entries)
            log.warning(
                "recovered %d turns of lapsed members %s (worst %.2fs after the last heartbeat)",
                len(out),
                dead,
                worst,
            )
        return out

    def _dead(self, holders: set[str], records: dict[str, MemberRecord]) -> list[str]:
        """The holders to recover from: lapsed (or gone) and already out of this router's ring,
        so a recovered turn is never placed on the dead member again; none while no member on
        the ring takes new work, since a recovery could not be sent on."""
        ring = self.ring()
        on_ring = {m.name for m in ring.members}
        dead = sorted(
            m for m in holders if (m not in records or not records[m].live) and m not in on_ring
        )
        if not dead or not any(not m.draining for m in ring.members):
            return []
        return dead

    def _recover_member(self, member: str, rec: MemberRecord | None) -> list[dict[str, Any]]:
        """Take and recover each turn ``member`` holds; its recovery entries. A member that
        holds nothing and is no longer registered (``rec`` None) is forgotten."""
        held = self.holdings.held(member)
        if not held:
            if rec is None:
                self.holdings.forget(member)
            return []
        last_beat = rec.heartbeat_at if rec is not None else -math.inf
        entries: list[dict[str, Any]] = []
        for h in held:
            if not self.holdings.take(member, h):
                continue  # another router took it
            if not self._recover(h):
                continue
            since = self.holdings.redis_now() - last_beat
            entries.append(
                {
                    "member": member,
                    "tenant": h.tenant,
                    "trajectory_id": h.trajectory_id,
                    "since_heartbeat_s": round(since, 3) if math.isfinite(since) else None,
                    "by": self.by,
                }
            )
            if math.isfinite(since):
                self.figures.append(since)
        return entries

    def _recover(self, h: Held) -> bool:
        """``Recover`` by compare-and-set while the record is still in the sent turn."""
        try:
            rec = self.api.store.load(h.tenant, h.trajectory_id)
            if not self._stranded(rec, h):
                return False
            return self.api.recover(rec, lambda now: self._stranded(now, h), by=self.by)
        except ReinsError as exc:
            log.warning("recovery of %s/%s failed: %s", h.tenant, h.trajectory_id, exc)
            return False

    def _stranded(self, rec: TrajectoryRecord, h: Held) -> bool:
        """True while ``rec`` is still in the turn ``h`` sent. A record found READY is queued
        again: the turn ended, but its notice may have died with the member (killed between
        the commit and the push); a duplicate queue entry is refused."""
        if rec.state is LifecycleState.READY:
            self.api.requeue(rec)
            return False
        return (
            rec.state in ACTING
            and _sent_turn(rec, h.call_id) == rec.turn
            and rec.control_epoch == h.epoch
            and rec.record_version >= h.version
        )


def _sent_turn(rec: TrajectoryRecord, call_id: str) -> int | None:
    """The turn that registered ``call_id`` (a model call's id names it; a tool's op holds it)."""
    op = rec.operations.get(call_id)
    if op is None:
        return None
    if op.kind is OpKind.MODEL:
        _, _, n = call_id.rpartition("/m")
        return int(n) if n.isdigit() else None
    return op.turn
