"""Agents as a user's module declares them, loaded by reference ``MODULE:AGENT``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernel.agent import AgentProfile
from kernel.errors import UnknownAgent
from worker.backend import ToolBackend
from worker.models import PolicyFn


@dataclass(frozen=True)
class AgentModule:
    """An agent profile plus how to build its tool backend and its scripted policy."""

    profile: AgentProfile
    make_backend: Callable[[], ToolBackend]
    make_policy: Callable[[str], PolicyFn]  # the scripted provider's policy for a goal


def resolve(ref: str, kind: str) -> tuple[str, str, Any]:
    """Import ``MODULE:NAME``: (module name, name, the object or None if the module lacks it).

    A reference of the wrong form, or a module that cannot be imported, is refused naming it.
    """
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise UnknownAgent(f"{kind} reference {ref!r} must look like MODULE:NAME")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UnknownAgent(f"{kind} module {module_name!r} cannot be imported: {exc}") from None
    return module_name, attr, getattr(module, attr, None)


def load_agent(ref: str) -> AgentModule:
    """Import ``MODULE:AGENT``; refuse a reference that does not name an agent."""
    module_name, attr, agent = resolve(ref, "agent")
    if not isinstance(agent, AgentModule):
        raise UnknownAgent(f"{module_name} has no agent named {attr!r}")
    return agent
