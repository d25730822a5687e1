"""Who may write memory (seed 000's write policy): a fact's provenance and trust come from the
run's record, never from the model; the agent's policy says which sources write which scopes;
a bad policy is refused when the agent is loaded, naming what is wrong."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from examples.support_store.notes import agent as notes
from kernel.amounts import Amounts
from kernel.budget import Budget
from kernel.errors import ConfigError, InvalidInput
from kernel.memory import Provenance, Scope, Source, Trust
from kernel.memory_policy import (
    DEFAULT_POLICY,
    MemoryPolicy,
    concerns_of,
    output_trust,
    provenance_of,
)
from kernel.record import Operation, OpKind, OpStatus, TrajectoryRecord
from router.fleet.agents import load_agent

CATALOG = notes.profile.catalog  # get_order trusted; read_ticket untrusted, names customers


def record(*results: tuple[str, str, dict[str, Any]]) -> TrajectoryRecord:
    """A run of cu_ana that has read ``results``: (call id, tool, evidence) each."""
    rec = TrajectoryRecord.create(
        trajectory_id="t1",
        tenant="acme",
        user="cu_ana",
        goal="refund ord_1001",
        agent="examples.support_store.notes:agent",
        budget=Budget(),
        now=0.0,
    )
    for call_id, tool, evidence in results:
        rec.operations[call_id] = Operation(
            op_id=call_id,
            call_id=call_id,
            kind=OpKind.TOOL,
            attempts=[f"{call_id}/a1"],
            idempotency_key=f"k-{call_id}",
            epoch=0,
            reservation=Amounts(),
            status=OpStatus.SETTLED,
            tool=tool,
            evidence={"attempt": f"{call_id}/a1", **evidence},
        )
    return rec


ORDER = ("t1/t1", "get_order", {"status": "ok", "total_cents": 4200})
TICKET = ("t1/t2", "read_ticket", {"status": "ok", "customer": "cu_bob", "text": "remember..."})


def prov(rec: TrajectoryRecord, cited: str | None = None, approved: bool = False) -> Provenance:
    return provenance_of(rec, CATALOG, cited=cited, approved=approved)


def test_a_write_after_trusted_results_only_is_trusted_and_names_its_source() -> None:
    rec = record(ORDER)
    assert prov(rec) == Provenance(source=Source.MODEL, trust=Trust.TRUSTED)
    assert prov(rec, "goal") == Provenance(source=Source.GOAL, trust=Trust.TRUSTED)
    cited = prov(rec, "t1/t1")
    assert (cited.source, cited.trust, cited.call_ids) == (
        Source.TOOL_RESULT,
        Trust.TRUSTED,
        ("t1/t1",),
    )


def test_once_the_run_has_read_untrusted_content_no_citation_makes_a_write_trusted() -> None:
    rec = record(ORDER, TICKET)
    for cited in (None, "goal", "t1/t1"):
        found = prov(rec, cited)
        assert (found.source, found.trust) == (Source.TOOL_RESULT, Trust.UNTRUSTED), cited
        assert "t1/t2" in found.call_ids  # found and removed by the ticket's call
    # a reviewer who approved exactly this write vouches for it; the calls stay on record
    approved = prov(rec, approved=True)
    assert (approved.source, approved.trust, approved.call_ids) == (
        Source.REVIEWER,
        Trust.TRUSTED,
        ("t1/t2",),
    )


def test_a_recalled_untrusted_fact_makes_the_next_write_untrusted() -> None:
    clean = ("t1/t3", "recall_facts", {"status": "ok", "facts": [{"trust": "trusted"}]})
    dirty = ("t1/t4", "recall_facts", {"status": "ok", "facts": [{"trust": "untrusted"}]})
    assert prov(record(clean)).trust is Trust.TRUSTED
    assert prov(record(clean, dirty)) == Provenance(
        source=Source.TOOL_RESULT, trust=Trust.UNTRUSTED, call_ids=("t1/t4",)
    )
    op = record(dirty).operations["t1/t4"]
    assert output_trust(op, CATALOG) is Trust.UNTRUSTED


def test_a_citation_of_anything_but_the_goal_or_a_result_read_is_refused_naming_source() -> None:
    with pytest.raises(InvalidInput) as refused:
        prov(record(ORDER), "t1/t9")
    assert refused.value.field == "source"


def test_an_item_concerns_the_runs_user_and_the_users_its_results_name() -> None:
    assert concerns_of(record(ORDER), CATALOG) == ("cu_ana",)
    assert concerns_of(record(ORDER, TICKET), CATALOG) == ("cu_ana", "cu_bob")


def test_the_default_policy_keeps_untrusted_content_out_of_tenant_and_agent_facts() -> None:
    untrusted = Provenance(source=Source.TOOL_RESULT, trust=Trust.UNTRUSTED, call_ids=("t1/t2",))
    trusted = Provenance(source=Source.MODEL, trust=Trust.TRUSTED)
    assert DEFAULT_POLICY.refusal(Scope.USER, untrusted) is None
    for scope in (Scope.TENANT, Scope.AGENT):
        why = DEFAULT_POLICY.refusal(scope, untrusted)
        assert why is not None and "t1/t2" in why and scope.value in why
        assert DEFAULT_POLICY.refusal(scope, trusted) is None
    assert MemoryPolicy().episodes_per_user, "episodes are filed under the user by default"


def test_a_policy_says_which_sources_write_which_scopes() -> None:
    policy = MemoryPolicy(writes={"tenant": ["goal", "reviewer"]}, untrusted_writes=[])
    goal = Provenance(source=Source.GOAL, trust=Trust.TRUSTED)
    model = Provenance(source=Source.MODEL, trust=Trust.TRUSTED)
    untrusted = Provenance(source=Source.TOOL_RESULT, trust=Trust.UNTRUSTED)
    assert policy.refusal(Scope.TENANT, goal) is None
    assert "model" in (policy.refusal(Scope.TENANT, model) or "")
    assert policy.refusal(Scope.USER, model) is None  # a scope left out: every source
    assert policy.refusal(Scope.USER, untrusted) is not None  # no scope takes untrusted


@pytest.mark.parametrize(
    ("policy", "named"),
    [
        ("MemoryPolicy(writes={'tenants': ['goal']})", "'tenants'"),
        ("MemoryPolicy(writes={'tenant': ['goal', 'webpage']})", "'webpage'"),
        ("MemoryPolicy(untrusted_writes=['user', 'everyone'])", "'everyone'"),
    ],
)
def test_a_policy_naming_an_unknown_scope_or_source_is_refused_at_agent_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str, named: str
) -> None:
    module = f"bad_memory_agent_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from dataclasses import replace\n"
        "from examples.support_store import make_agent\n"
        "from kernel.memory_policy import MemoryPolicy\n"
        "base = make_agent()\n"
        f"agent = replace(base, profile=replace(base.profile, memory={policy}))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=named) as refused:
        load_agent(f"{module}:agent")
    assert refused.value.field is not None and refused.value.field.startswith("memory.")
    sys.modules.pop(module, None)
