"""The wire between routers and workers: notices and turn messages survive their encoding, and
anything malformed is refused as bad input."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kernel.budget import Budget
from kernel.errors import InvalidInput
from kernel.events import CallModel, DispatchTool
from router.wire.notices import NOTICE_FORMAT, Notice, NoticeKind, ready_notice
from router.wire.turns import TurnMessage
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
    assert back.returning("p/m").service_class == "maintenance", "the requeue names its class"
    rec.service_class = None
    plain = ready_notice(rec, "", 1.0)
    assert "service_class" not in json.loads(plain.encode()), "a field at its default stays off"
    assert Notice.decode(plain.encode()).returning(None).service_class is None


def test_a_notice_carries_the_replys_quota_feedback_and_only_when_there_is_some() -> None:
    limits = {"x-ratelimit-remaining-requests": "0", "retry-after-ms": "800"}
    notice = Notice(NoticeKind.READY, "a", "t", 3, lease_route="p/m", rate_limits=limits)
    said = Notice.decode(replace(notice, retry_after_s=0.8).encode())
    assert said.feedback and said.retry_after_s == 0.8 and said.rate_limits == limits
    assert said.service_class == ""
    assert not Notice.decode(replace(notice, rate_limits={}).encode()).feedback
    assert "rate_limits" not in json.loads(replace(notice, rate_limits={}).encode())


def test_a_notice_is_written_by_field_name_with_its_format() -> None:
    notice = Notice(NoticeKind.READY, "acme", "t", 7, "t/m1", input_tokens=120, route="p/m")
    body = json.loads(notice.encode())
    assert body == {
        "format": NOTICE_FORMAT,
        "kind": "ready",
        "tenant": "acme",
        "trajectory_id": "t",
        "version": 7,
        "call_id": "t/m1",
        "input_tokens": 120,
        "route": "p/m",
    }, "every field by its name; those at their default left out"


#: Notices as the build before this one wrote them (format 1: the fields in order, trailing
#: defaults after ``used_tokens`` left out), byte for byte.
FORMAT_1 = [
    b'["ready","acme","t",7,"t/m1",120,300,1.5,"p/m","c9","p/m",44]',
    b'["idle","a","t",1,"",0,1,0.0,"","","",-1]',
    b'["ready","a","t",3,"",0,1,0.0,"","","p/m",-1,"gold",0.8,{"retry-after-ms":"800"}]',
]


def test_a_notice_an_older_build_wrote_by_position_still_decodes() -> None:
    first, idle, said = (Notice.decode(raw) for raw in FORMAT_1)
    assert first == Notice(
        NoticeKind.READY, "acme", "t", 7, "t/m1", 120, 300, 1.5, "p/m", "c9", "p/m", 44
    )
    assert idle == Notice(NoticeKind.IDLE, "a", "t", 1)
    assert (said.service_class, said.retry_after_s) == ("gold", 0.8)
    assert said.rate_limits == {"retry-after-ms": "800"} and said.feedback
    assert json.loads(first.encode())["format"] == NOTICE_FORMAT, "and is written anew by name"


HEADERS_NOT_TEXT = b'["ready","a","t",1,"",0,1,0.0,"","","",-1,"",-1.0,{"x-ratelimit-limit":1}]'
UNKNOWN_FIELD = b'{"format":2,"kind":"idle","tenant":"a","trajectory_id":"t","version":1,"x":1}'
NEWER_FORMAT = b'{"format":3,"kind":"idle","tenant":"a","trajectory_id":"t","version":1}'
TOO_MANY = b'["idle","a","t",1,"",0,1,0.0,"","","",-1,"",-1.0,{},"extra"]'
NO_VERSION = b'{"format":2,"kind":"idle","tenant":"a","trajectory_id":"t"}'


@pytest.mark.parametrize(
    "raw",
    [
        b"{}",
        b"[]",
        b'["nope", "a", "t", 1]',
        b"not json",
        HEADERS_NOT_TEXT,
        UNKNOWN_FIELD,
        NEWER_FORMAT,
        TOO_MANY,
        NO_VERSION,
    ],
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
