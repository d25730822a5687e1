"""A router with a fault installed, for process tests: ``python -m tests.fleet.router_faults
router --name R ...`` runs ``reins router`` exactly, after wrapping one method of the router's
parts as :data:`FAULT_VAR` in its environment says (the runtime has no hook for it):

- ``die-after-ready-takes:N``: the Nth time the router takes a batch of notices holding a READY
  one, it SIGKILLs itself, after the take and before it acts on or acknowledges the notices
  (a router dying between the pop and the requeue);
- ``requeue-raises:N``: the shared admitter's first N requeues of READY notices raise
  :class:`~kernel.errors.StoreUnavailable` (the requeue failing after the take).

Each logs one line naming the fault when it fires. Used by ``tests/fleet/test_feed_processes.py``
(``LocalFleet.start(..., module=__name__)``).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

from kernel.errors import ConfigError, StoreUnavailable
from ops.cli import fleet as fleet_cli
from router.process.service import RouterService
from router.wire.notices import NoticeKind
from router.wire.streams import Taken

log = logging.getLogger("reins.router.faults")
MODULE = __name__
FAULT_VAR = "TEST_ONLY_ROUTER_FAULT"
DIE_AFTER_READY_TAKES = "die-after-ready-takes"
REQUEUE_RAISES = "requeue-raises"


def install(service: RouterService, env: Mapping[str, str]) -> None:
    """Wrap ``service`` as :data:`FAULT_VAR` in ``env`` says; nothing when it is unset."""
    spec = env.get(FAULT_VAR, "")
    if not spec:
        return
    kind, _, count = spec.partition(":")
    if not count.isdigit() or int(count) < 1:
        raise ConfigError(f"{FAULT_VAR}={spec!r}: expected KIND:N with N >= 1")
    n = int(count)
    if kind == DIE_AFTER_READY_TAKES:
        _die_after_ready_takes(service, n)
    elif kind == REQUEUE_RAISES:
        _requeue_raises(service, n)
    else:
        raise ConfigError(f"{FAULT_VAR}={spec!r}: unknown fault {kind!r}")
    log.warning("TEST ONLY: fault %s installed in router %s", spec, service.name)


def _die_after_ready_takes(service: RouterService, n: int) -> None:
    feed = service.feed
    take = feed.take
    seen = 0

    def taking(*args: Any, **kwargs: Any) -> Taken[Any]:
        nonlocal seen
        taken = take(*args, **kwargs)
        if any(notice.kind is NoticeKind.READY for notice in taken):
            seen += 1
            if seen == n:
                ids = ",".join(i.decode() for i in taken.ids)
                log.warning("TEST ONLY: fault fired: SIGKILL after taking notices %s", ids)
                os.kill(os.getpid(), signal.SIGKILL)
        return taken

    feed.take = taking  # type: ignore[method-assign]


def _requeue_raises(service: RouterService, n: int) -> None:
    if not service.shared:
        raise ConfigError(f"{FAULT_VAR}: {REQUEUE_RAISES} needs the shared admitter")
    admitter: Any = service.dispatcher.admitter
    requeue_many = admitter.requeue_many
    left = n

    def requeueing(calls: Any) -> Any:
        nonlocal left
        if left > 0:
            left -= 1
            calls = list(calls)
            ids = ",".join(str(c[1]) for c in calls)
            log.warning("TEST ONLY: fault fired: the requeue of %s raises", ids)
            raise StoreUnavailable("TEST ONLY: injected requeue failure")
        return requeue_many(calls)

    admitter.requeue_many = requeueing


def _run_with_faults(run: Callable[[RouterService], int]) -> Callable[[RouterService], int]:
    def running(service: RouterService) -> int:
        install(service, os.environ)
        return run(service)

    return running


if __name__ == "__main__":
    RouterService.run = _run_with_faults(RouterService.run)  # type: ignore[method-assign]
    fleet_cli.main()
