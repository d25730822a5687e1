"""Custody of turns: which member has which turn, recorded before its message is sent.

A router records each turn in the custody of the member it sends it to before it sends the
message (a member that admits a follow-on turn itself records it before its admission commits);
the worker releases it after pushing the turn's notice (a release names its version, so a late
one never drops a newer entry). The reconciler (:mod:`router.process.reconcile`) takes the
entries of a lapsed member and recovers their turns. Keys, under the feed's hash tag (the
two-key scripts in ``lua/`` run in its slot, and a worker's notice and release stay one ordered
batch; :mod:`router.wire.keyspace`)::

    {P:fleet}:custody:m:<member>   hash   "<tenant>/<trajectory>" -> "<version>:<epoch>:<call id>"
    {P:fleet}:custody:members      set    the members that have (or had) turns in custody
    {P:fleet}:recoveries           list   one JSON entry per recovery (member, trajectory,
                                          seconds from the last heartbeat, router)

Design: ``docs/adr/0008-turn-recovery.md``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import redis

from kernel.errors import ReinsError
from kernel.record import OpKind, TrajectoryRecord
from kernel.states import ACTING, LifecycleState
from router.wire.keyspace import fleet_tag
from router.wire.turns import TurnMessage
from store.redis_client import Batch, retry_transient, script_reply, text
from store.redis_direct import direct_batch
from store.scripts import scripts_beside

log = logging.getLogger("reins.router.custody")
RECOVERIES_CAP = 100_000

SCRIPTS = scripts_beside(__file__)


@dataclass(frozen=True, slots=True)
class Entrusted:
    """One turn in a member's custody: where the record was when its message was sent."""

    tenant: str
    trajectory_id: str
    version: int
    epoch: int
    call_id: str
    raw: str

    @classmethod
    def parse(cls, key: str, raw: str) -> Entrusted:
        tenant, _, tid = key.partition("/")
        version, epoch, call_id = raw.split(":", 2)
        return cls(tenant, tid, int(version), int(epoch), call_id, raw)

    def in_turn(self, rec: TrajectoryRecord) -> bool:
        """True while ``rec`` is still acting in the turn this entry was sent for."""
        return (
            (rec.state in ACTING or rec.state is LifecycleState.FINALIZING)
            and sent_turn(rec, self.call_id) == rec.turn
            and rec.control_epoch == self.epoch
            and rec.record_version >= self.version
        )


def sent_turn(rec: TrajectoryRecord, call_id: str) -> int | None:
    """The turn that registered ``call_id`` (a model call's id names it; a tool's op holds it)."""
    op = rec.operations.get(call_id)
    if op is None:
        return None
    if op.kind is OpKind.MODEL:
        _, _, n = call_id.rpartition("/m")
        return int(n) if n.isdigit() else None
    return op.turn


class CustodyEntry(NamedTuple):
    """One turn in one member's custody, as written: the member, the field (the trajectory)
    and the value (the version, epoch and call id the turn was sent at)."""

    member: str
    field: str
    value: str


def _entry(member: str, payload: dict[str, Any]) -> CustodyEntry:
    """The custody entry of turn message ``payload`` for ``member``."""
    commands = payload.get("commands") or [{}]
    return _entry_of(
        member,
        f"{payload['tenant']}/{payload['trajectory_id']}",
        int(payload["version"]),
        int(payload["epoch"]),
        str(commands[0].get("call_id", "")),
    )


def _entry_of(member: str, key: str, version: int, epoch: int, call_id: str) -> CustodyEntry:
    return CustodyEntry(member, key, f"{version}:{epoch}:{call_id}")


class Custody:
    """Which member has which turn in custody (see the module docstring)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        tag = fleet_tag(prefix)
        self.tag = f"{tag}:custody"
        self.members_key = f"{self.tag}:members"
        self.recoveries_key = f"{tag}:recoveries"
        self._release = SCRIPTS("custody_release.lua")
        self._forget = SCRIPTS("custody_forget.lua")
        self._orphan = SCRIPTS("custody_orphan.lua")
        self._pending: list[CustodyEntry] = []

    def key(self, member: str) -> str:
        return f"{self.tag}:m:{member}"

    # --- the router's side -------------------------------------------------------------------

    def note(self, member: str, payload: dict[str, Any]) -> None:
        """Buffer the custody entry of the turn message ``payload`` sent to ``member``."""
        self._pending.append(_entry(member, payload))

    def flush(self) -> None:
        """Write the buffered entries (one round trip); call before the messages are sent."""
        pending, self._pending = self._pending, []
        if not pending:
            return

        def write() -> None:  # idempotent: retried as a whole
            pipe = direct_batch(self.client)
            self._write_on(pipe, pending)
            pipe.execute()

        try:
            retry_transient(write, what="writing the custody of turns", attempts=4, counted=4)
        except ReinsError:
            self._pending = pending + self._pending  # written before anything is sent
            raise

    def commands(self, member: str, msg: TurnMessage) -> list[tuple[str, ...]]:
        """The commands that write the custody entry of turn message ``msg`` for ``member``, for a
        member that admits a turn itself to send before its admission commits
        (:mod:`worker.follow_on`); idempotent, as a resend after a lost reply needs. Read from the
        message's fields: its payload would dump the model's whole view."""
        call_id = msg.commands[0].call_id if msg.commands else ""
        key = f"{msg.tenant}/{msg.trajectory_id}"
        return self._commands([_entry_of(member, key, msg.version, msg.epoch, call_id)])

    def _write_on(self, pipeline: Batch, pending: list[CustodyEntry]) -> None:
        for command in self._commands(pending):
            pipeline.execute_command(*command)

    def _commands(self, pending: list[CustodyEntry]) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = [
            ("HSET", self.key(member), field_, value) for member, field_, value in pending
        ]
        out.append(("SADD", self.members_key, *sorted({m for m, _, _ in pending})))
        return out

    def sending(self, inner: Callable[[str, dict[str, Any]], None]) -> Callable[..., None]:
        """A sender that records each custody entry, then sends through ``inner`` at once."""

        def send(member: str, payload: dict[str, Any]) -> None:
            self.note(member, payload)
            self.flush()
            inner(member, payload)

        return send

    def buffering(self, inner: Callable[[str, dict[str, Any]], None]) -> Callable[..., None]:
        """A sender that buffers each custody entry (:meth:`flush` before ``inner``'s own flush)."""

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
        an entry was deleted; with ``pipeline`` the release is only queued on it (False), as a
        bare ``EVALSHA``: a script object would make redis-py ask ``SCRIPT EXISTS`` before
        every pipeline, a round trip per turn. Pass the pipeline's reply to
        :meth:`released_on` to finish it."""
        args = [f"{tenant}/{trajectory_id}", str(version), "version"]
        if pipeline is not None:
            pipeline.execute_command(*self._release.command([self.key(member)], args))
            return False
        return bool(self._release.run(self.client, [self.key(member)], args))

    def released_on(
        self, reply: Any, member: str, tenant: str, trajectory_id: str, version: int
    ) -> bool:
        """Finish a release queued on a pipeline from its ``reply`` (executed with
        ``raise_on_error=False``; :func:`~store.redis_store.script_reply`)."""
        return bool(
            script_reply(reply, lambda: self.release(member, tenant, trajectory_id, version))
        )

    # --- the reconciler's side ---------------------------------------------------------------

    def custodians(self) -> set[str]:
        """The members that have (or had) turns in custody."""
        raw = cast(set[bytes], self.client.smembers(self.members_key))
        return {text(m) for m in raw}

    def entrusted_to(self, member: str) -> list[Entrusted]:
        """The turns in ``member``'s custody, by trajectory; an unreadable entry is dropped."""
        raw = cast(dict[bytes, bytes], self.client.hgetall(self.key(member)))
        out = []
        for k, v in raw.items():
            try:
                out.append(Entrusted.parse(text(k), text(v)))
            except ValueError:
                log.warning("bad custody entry %r=%r of %s dropped", k, v, member)
                self.client.hdel(self.key(member), k)
        return sorted(out, key=lambda h: (h.tenant, h.trajectory_id))

    def take(self, member: str, turn: Entrusted) -> bool:
        """Claim the recovery of ``turn``: True for exactly one caller."""
        args = [f"{turn.tenant}/{turn.trajectory_id}", turn.raw, "exact"]
        return bool(self._release.run(self.client, [self.key(member)], args))

    def orphan(self, member: str, previous: str) -> int:
        """Hand every turn in ``member``'s custody to ``previous``, a custodian no member is
        named after (an earlier incarnation of ``member``): the reconciler finds it not live
        and recovers its turns. Returns how many turns moved."""
        keys = [self.key(member), self.key(previous), self.members_key]
        return int(self._orphan.run(self.client, keys, [previous]))

    def naming(self, tenant: str, trajectory_id: str) -> list[tuple[str, Entrusted]]:
        """Every custodian's entry for the trajectory (one round trip after the custodians)."""
        custodians = sorted(self.custodians())
        if not custodians:
            return []
        field = f"{tenant}/{trajectory_id}"
        pipe = self.client.pipeline(transaction=False)
        for member in custodians:
            pipe.hget(self.key(member), field)
        out = []
        for member, raw in zip(custodians, pipe.execute(), strict=True):
            if raw is not None:
                with contextlib.suppress(ValueError):
                    out.append((member, Entrusted.parse(field, text(raw))))
        return out

    def forget(self, member: str) -> bool:
        """Drop ``member`` from the custodians once it has nothing in custody."""
        return bool(self._forget.run(self.client, [self.members_key, self.key(member)], [member]))

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
