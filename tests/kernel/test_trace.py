"""Spans, post-mortems and the execution chain (seed 000 "Tracing and failure", seed 001 s.9)."""

from __future__ import annotations

from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import RefundPolicy, new_ids, same_call, search_loop
from kernel.budget import Budget
from kernel.chain import RowKind
from kernel.trace import postmortem, redact, render_tree, spans_from_chain
from tests.kernel.harness import go


def test_postmortem_signature_b_stuck_read() -> None:
    pm = postmortem(go(same_call).out.rows)
    assert pm["stop"] == "repeated_call" and pm["steps"] == 3
    assert pm["first_error"] == ["get_order", "not_found"]
    assert pm["most_repeated"] == ["get_order", {"order_id": "ord_9999"}, 2]
    assert (pm["model_s"], pm["tool_s"]) == (4.5, 0.8)
    sizes = pm["input_tokens_by_step"]
    assert sizes[1] == sizes[2], "flat input sizes"


def test_postmortem_signature_c_no_call_repeated_flat_inputs() -> None:
    pm = postmortem(go(new_ids).out.rows)
    assert pm["stop"] == "no_progress"
    assert pm["first_error"] == ["get_order", "not_found"]
    assert pm["most_repeated"][2] == 1
    assert (pm["model_s"], pm["tool_s"]) == (4.5, 1.2)
    assert pm["input_tokens_by_step"][1] == pm["input_tokens_by_step"][2]


def test_postmortem_signature_d_input_jumps_and_stays() -> None:
    pm = postmortem(
        go(search_loop, Budget(max_stalls=10, max_tool_calls=20, max_steps=20)).out.rows
    )
    assert pm["stop"] == "max_tokens" and pm["first_error"] is None
    first, *rest = pm["input_tokens_by_step"]
    assert first < 100 and all(s > 1000 for s in rest) and len(set(rest)) == 1
    assert (pm["model_s"], pm["tool_s"]) == (6.0, 3.2)


def test_postmortem_signature_h_write_timeout_dominates_time() -> None:
    r = go(RefundPolicy(), backend=SupportStoreBackend(latency={"issue_refund": 40.0}))
    pm = postmortem(r.out.rows)
    assert pm["stop"] == "unknown_outcome"
    assert pm["first_error"] == ["issue_refund", "timeout"]
    assert (pm["model_s"], pm["tool_s"]) == (4.5, 25.5)


def test_span_tree_task_step_model_tool() -> None:
    rows = go(RefundPolicy()).out.rows
    spans = spans_from_chain(rows, model="refund-policy")
    kinds = [s.kind for s in spans]
    assert kinds.count("task") == 1 and kinds.count("step") == 5
    assert kinds.count("model") == 5 and kinds.count("tool") == 3
    by_id = {s.span_id: s for s in spans}
    for s in spans:
        if s.kind in ("model", "tool"):
            assert by_id[s.parent_id].kind == "step"  # type: ignore[index]
    tool = next(s for s in spans if s.kind == "tool" and "issue_refund" in s.name)
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["reins.call_key"].startswith("t1:s2:issue_refund:")
    assert tool.attributes["reins.trajectory_id"] == "t1"
    assert (spans[0].start, spans[0].end) == (0.0, 10.0)
    assert len(render_tree(spans)) == len(spans)


def test_redaction() -> None:
    assert redact({"email": "a@b", "nested": {"card": "4111"}, "order_id": "o"}) == {
        "email": "[redacted]",
        "nested": {"card": "[redacted]"},
        "order_id": "o",
    }


def test_the_run_can_be_reconstructed_from_the_chain_alone() -> None:
    r = go(RefundPolicy(), Budget(max_steps=3))
    rows, rec = r.out.rows, r.rec
    assert [row.index for row in rows] == list(range(rec.chain_length))
    assert {row.trajectory_id for row in rows} == {"t1"} and {row.user for row in rows} == {
        "cu_ana"
    }
    tools = [(row.tool, row.args, row.outcome) for row in rows if row.kind is RowKind.TOOL]
    assert tools == [
        ("get_order", {"order_id": "ord_1001"}, "ok"),
        ("issue_refund", {"order_id": "ord_1001", "amount_cents": 3000, "reason": "damaged"}, "ok"),
    ]
    models = [row for row in rows if row.kind is RowKind.MODEL]
    assert len(models) == rec.turn
    assert sum(m.tokens_in + m.tokens_out for m in models) == rec.ledger.tokens.actual
    assert round(sum(row.duration_s for row in rows), 6) == rec.active_s
    assert rows[-1].kind is RowKind.STOP and rows[-1].outcome == rec.stop_reason
