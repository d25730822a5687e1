"""The wire between routers and workers: notices and turn messages survive their encoding, and
anything malformed is refused as bad input."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kernel.budget import Budget
from kernel.errors import InvalidInput
from kernel.events import CallModel, DispatchTool
from router.feed import Notice, NoticeKind, ready_notice
from router.turn_message import TurnMessage
from tests.kernel.harness import new_record

CALL = CallModel(call_id="t/m1", attempt_id="t/m1/a1", view="{}", max_output_tokens=9, timeout_s=3)
TOOL = DispatchTool(
    call_id="t/t1",
    attempt_id="t/t1/a1",
    tool="get_order",
    args={"order_id": "o"},
    idempotency_key="k",
    timeout_s=2,
)


def test_a_notice_round_trips() -> None:
    notice = Notice(NoticeKind.READY, "acme", "t", 7, "t/m1", 120, 300, 1.5, "p/m", "c9", "p/m", 44)
    assert Notice.decode(notice.encode()) == notice
    assert Notice.decode(Notice(NoticeKind.IDLE, "a", "t", 1).encode()).kind is NoticeKind.IDLE


def test_a_ready_notice_carries_its_records_class_and_an_unset_one_stays_off_the_wire() -> None:
    rec = new_record(Budget(max_steps=5))
    rec.service_class = "maintenance"
    notice = ready_notice(rec, "", 1.0, "p/m")
    back = Notice.decode(notice.encode())
    assert back.service_class == "maintenance"
    assert back.returning("p/m")[4] == "maintenance", "the requeue names the record's class"
    rec.service_class = None
    plain = ready_notice(rec, "", 1.0)
    assert len(json.loads(plain.encode())) == 12, "what routers of the build before read"
    assert Notice.decode(plain.encode()).returning(None)[4] is None


def test_a_notice_carries_the_replys_quota_feedback_and_only_when_there_is_some() -> None:
    limits = {"x-ratelimit-remaining-requests": "0", "retry-after-ms": "800"}
    notice = Notice(NoticeKind.READY, "a", "t", 3, lease_route="p/m", rate_limits=limits)
    said = Notice.decode(replace(notice, retry_after_s=0.8).encode())
    assert said.feedback and said.retry_after_s == 0.8 and said.rate_limits == limits
    assert said.service_class == "", "the fields before are written as placeholders"
    assert not Notice.decode(replace(notice, rate_limits={}).encode()).feedback
    assert len(json.loads(replace(notice, rate_limits={}).encode())) == 12


HEADERS_NOT_TEXT = b'["ready","a","t",1,"",0,1,0.0,"","","",-1,"",-1.0,{"x-ratelimit-limit":1}]'


@pytest.mark.parametrize(
    "raw", [b"{}", b"[]", b'["nope", "a", "t", 1]', b"not json", HEADERS_NOT_TEXT]
)
def test_a_malformed_notice_is_refused(raw: bytes) -> None:
    with pytest.raises(InvalidInput, match="malformed notice"):
        Notice.decode(raw)


def test_a_turn_message_round_trips_with_its_commands() -> None:
    msg = TurnMessage("acme", "t", 3, 1, (CALL, TOOL), 12.5, "r1", "c4", "p/m", follow_on=5)
    assert TurnMessage.from_payload(msg.to_payload()) == msg
    assert msg.call_id == "t/m1"


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"tenant": "a", "trajectory_id": "t", "version": "x", "epoch": 0},
        {
            "tenant": "a",
            "trajectory_id": "t",
            "version": 1,
            "epoch": 0,
            "commands": [{"type": "finish"}],
        },
        "not a mapping",
        {"tenant": "a", "trajectory_id": "t", "version": 1, "epoch": 0, "follow_on": -1},
        {"tenant": "a", "trajectory_id": "t", "version": 1, "epoch": 0, "follow_on": "many"},
    ],
)
def test_a_malformed_turn_message_is_refused(payload: object) -> None:
    with pytest.raises(InvalidInput, match="malformed turn message"):
        TurnMessage.from_payload(payload)
