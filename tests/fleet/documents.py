"""The fleet's document in Redis, as the fleet tests write it, and ``reins config apply`` run
as an operator runs it (the fixtures of fleets that read it are in ``conftest.py``)."""

from __future__ import annotations

from pathlib import Path

from tests.api.test_admin_cli import reins
from tests.fleet.conftest import ROUTE
from tests.fleet.harness import AGENT


def fleet_document(
    weights: dict[str, int],
    classes: dict[str, dict[str, int]] | None = None,
    *,
    agent: str = AGENT,
    gate: str = f'[gates.routes."{ROUTE}"]\nconcurrency = 6\nlease_ttl_s = 20\n',
) -> str:
    """The fleet's document: tenants of ``weights`` (and ``classes``, by tenant) running
    ``agent``, and ``gate`` (TOML; default: one gate of concurrency 6)."""
    parts = ["quantum_tokens = 1000\ncredit_cap_tokens = 12000\n"]
    for name, weight in weights.items():
        own = (classes or {}).get(name, {})
        listed = ", ".join(f'{{ name = "{c}", weight = {w} }}' for c, w in own.items())
        parts.append(
            f'[[tenants]]\nname = "{name}"\nweight = {weight}\nmax_ready = 2000\n'
            f'largest_call_tokens = 8000\nagents = ["{agent}"]\nbudget_max = {{ steps = 40 }}\n'
            + (f"classes = [{listed}]\n" if own else "")
        )
    parts.append(gate)
    return "\n".join(parts)


def config_apply(env: dict[str, str], path: Path) -> str:
    """``reins config apply PATH`` as an operator runs it, on the fleet of ``env``; its output."""
    done = reins(env["REINS_KEY_PREFIX"], "config", "apply", str(path))
    assert done.returncode == 0, done.stderr
    return done.stdout
