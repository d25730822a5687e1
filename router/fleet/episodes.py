"""The episode of every ended run, whichever process's commit ended it.

A run ends in a worker's turn (its own stop, a cancel it carried out), in a router (a stop the
admitter decided, a deadline at a tick, a recovery) or in the API process (a cancel or kill of
a run between turns). Each of them carries out the step's ``Finish`` command by writing the
run's episode here, when the agent's :class:`~kernel.memory_policy.MemoryPolicy` keeps them:
its stop reason, and its lesson from the closing message the kernel built from the state. The
episode's id is the trajectory's, so writing it twice (a redelivered turn) has one effect.

Writing is best effort: a memory store that does not answer costs the episode (logged), never
the commit, which has already happened.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kernel.agent import AgentProfile
from kernel.context import StepResult
from kernel.errors import ReinsError
from kernel.events import Finish
from kernel.memory import ms
from kernel.memory_policy import concerns_of
from kernel.memory_tools import episode_of
from kernel.record import TrajectoryRecord
from router.fleet.agents import AgentCache
from store.memory_base import MemoryBank

log = logging.getLogger("reins.memory")


def ended(result: StepResult) -> bool:
    """True when the step ``result`` ended its run (it asks for its ``Finish``)."""
    return any(isinstance(cmd, Finish) for cmd in result.commands)


def write_episode(
    bank: MemoryBank, rec: TrajectoryRecord, profile: AgentProfile, now_s: float
) -> bool:
    """Write the episode of the ended run ``rec`` if ``profile`` keeps episodes; False when it
    keeps none, or the store refused (logged)."""
    policy = profile.memory
    if policy is None or not policy.episodes or rec.stop_reason is None:
        return False
    try:
        concerns = concerns_of(rec, profile.catalog)
        bank.put(episode_of(rec, ms(now_s), policy.episodes_per_user, concerns))
    except ReinsError as exc:
        log.warning("%s: episode not written: %s", rec.trajectory_id, exc)
        return False
    return True


class Episodes:
    """Writes the episode of each run a committed step ended (nowhere without a ``bank``)."""

    def __init__(self, bank: MemoryBank | None, clock: Callable[[], float]) -> None:
        self.bank, self.clock = bank, clock

    def after(self, result: StepResult, profile: AgentProfile) -> bool:
        """After ``result`` was committed: its run's episode, if it ended the run."""
        if self.bank is None or not ended(result):
            return False
        return write_episode(self.bank, result.record, profile, self.clock())

    def after_loading(self, result: StepResult, agents: AgentCache) -> bool:
        """:meth:`after`, the profile loaded from ``agents`` only if the run ended; an agent
        that cannot be loaded now costs the episode (logged), never an error to the committer
        (whose commit has happened)."""
        if self.bank is None or not ended(result):
            return False
        rec = result.record
        try:
            profile = agents.get(rec.agent)[0].profile
        except ReinsError as exc:
            log.warning("%s: episode not written: %s", rec.trajectory_id, exc)
            return False
        return self.after(result, profile)
