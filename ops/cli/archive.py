"""Archiving: finished trajectories past their retention, written as JSON lines, then retired.

:func:`archive` writes, for each tenant, every trajectory due for retirement
(:func:`router.process.retention.due`) as one JSON line (``tenant``, ``trajectory_id``, ``version``,
``record``, ``chain``) to a new file ``DIR/<tenant>-<UTC time>.jsonl`` (written under a hidden
name, fsynced, renamed, and the directory fsynced); only then, and only when asked, retires
each at the version written, so a run that moved meanwhile is kept (and archived again when it
is due again). The directory may be a mounted object store's path prefix. Every argument is
checked before anything is read or written. Design: ``docs/adr/0186-archive.md``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from kernel.errors import InvalidInput, SnapshotNotFound, StoreError
from kernel.modeljson import model_json
from kernel.record import TrajectoryRecord
from router.process.retention import ENDED, due
from store.base import Retirement, TrajectoryStore

PAGE = 256  # index entries read per page of the walk


@dataclass(frozen=True)
class TenantArchive:
    """What one tenant's archive did."""

    tenant: str
    path: Path | None  # None: nothing was due, no file written
    written: int
    retired: int  # of those written; the others moved on meanwhile (or were already gone)

    def as_json(self) -> dict[str, object]:
        """For ``--json``."""
        path = None if self.path is None else str(self.path)
        return {
            "tenant": self.tenant,
            "path": path,
            "written": self.written,
            "retired": self.retired,
        }


def utc_stamp(t: float) -> str:
    """``t`` as the UTC time in an archive's name: ``20261201T233000Z``."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y%m%dT%H%M%SZ")


def check_directory(directory: Path) -> None:
    """Refuse (:class:`InvalidInput`) a path that is not a writable directory."""
    if not directory.is_dir():
        raise InvalidInput(f"archive directory {directory}: not a directory (create it first)")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidInput(f"archive directory {directory}: not writable by this user")


def walk_due(
    store: TrajectoryStore, tenant: str, now: float, keep_s: float
) -> Iterator[TrajectoryRecord]:
    """Every trajectory of ``tenant`` due at ``now``, a page of the ended index at a time."""
    for state in ENDED:
        after = ""
        while True:
            ids = store.page(tenant, state, after, PAGE)
            for tid in ids:
                try:
                    record = due(store, tenant, tid, now, keep_s)
                except SnapshotNotFound:  # retired meanwhile, or half-retired: not ours
                    continue
                if record is not None:
                    yield record
            if len(ids) < PAGE:
                break
            after = ids[-1]


def line(store: TrajectoryStore, record: TrajectoryRecord) -> bytes:
    """One archive line: the record and its chain as they stood at the record's version (the
    chain is append-only, so its first ``chain_length`` rows are that version's)."""
    tid = record.trajectory_id
    rows = store.read(record.tenant, tid)[: record.chain_length]
    head = json.dumps(
        {"tenant": record.tenant, "trajectory_id": tid, "version": record.record_version}
    )
    chain = b",".join(model_json(row) for row in rows)
    return (
        head[:-1].encode() + b', "record": ' + record.to_json() + b', "chain": [' + chain + b"]}\n"
    )


def archive(
    store: TrajectoryStore,
    keep_s: Mapping[str, float],
    directory: Path,
    *,
    now: float,
    retire: bool,
    stamp: Callable[[float], str] | None = None,
) -> list[TenantArchive]:
    """Archive (and with ``retire``, retire) what is due in each tenant of ``keep_s`` (its
    retention in seconds); see the module docstring."""
    check_directory(directory)
    stamp = stamp or utc_stamp
    negative = [t for t, s in keep_s.items() if s < 0]
    if negative:
        raise InvalidInput(f"retention of tenants {negative}: must not be negative")
    taken = [str(p) for t in keep_s if (p := directory / f"{t}-{stamp(now)}.jsonl").exists()]
    if taken:
        raise InvalidInput(f"archive files {taken} exist already: nothing was written")
    return [_one(store, t, s, directory, now, retire, stamp(now)) for t, s in keep_s.items()]


def _one(
    store: TrajectoryStore,
    tenant: str,
    keep_s: float,
    directory: Path,
    now: float,
    retire: bool,
    stamp: str,
) -> TenantArchive:
    final = directory / f"{tenant}-{stamp}.jsonl"
    partial = directory / f".{final.name}.partial"
    written: list[tuple[str, int]] = []
    try:
        with open(partial, "xb") as out:
            for record in walk_due(store, tenant, now, keep_s):
                out.write(line(store, record))
                written.append((record.trajectory_id, record.record_version))
            out.flush()
            os.fsync(out.fileno())
        if not written:
            partial.unlink()
            return TenantArchive(tenant, None, 0, 0)
        os.replace(partial, final)
        _fsync_directory(directory)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise StoreError(f"archive {final}: cannot write ({exc.strerror}); none retired") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    retired = 0
    if retire:
        for tid, version in written:
            retired += store.retire(tenant, tid, version) is Retirement.RETIRED
    return TenantArchive(tenant, final, len(written), retired)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable: fsync the directory that holds the file."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
