"""The provider gate contract, on memory and on Redis, with a clock moved by hand."""

from __future__ import annotations

import pytest

from router.admission.gates import Feedback, GateConfig, feedback_from
from tests.quota.conftest import MakeGates
from tests.support import ManualClock

ROUTE = "openai/gpt-4o-mini"


def limits(**kw: object) -> GateConfig:
    return GateConfig.from_mapping({"routes": {ROUTE: {"window_s": 60, "lease_ttl_s": 10, **kw}}})


def test_requests_per_window_count_until_a_window_after_settlement(
    make_gates: MakeGates, clock: ManualClock
) -> None:
    gates = make_gates(limits(rpm=3))
    assert [gates.debit(ROUTE, f"l{i}", 100).requests for i in range(3)] == [1, 2, 3]
    refused = gates.debit(ROUTE, "l3", 100)
    assert (refused.ok, refused.reason, refused.requests, refused.tokens) == (False, "rpm", 3, 300)
    clock.advance(5)
    gates.settle(ROUTE, "l0", 80)
    clock.advance(59.9)  # the settled request still counts: its window runs from settlement
    assert not gates.debit(ROUTE, "l3", 100).ok
    clock.advance(0.1)
    reading = gates.debit(ROUTE, "l3", 100)
    assert reading.ok and reading.requests == 3 and reading.tokens == 300


def test_tokens_are_debited_in_full_and_corrected_at_settlement(
    make_gates: MakeGates, clock: ManualClock
) -> None:
    gates = make_gates(limits(tpm=10_000))
    assert gates.debit(ROUTE, "a", 6_000).tokens == 6_000
    refused = gates.debit(ROUTE, "b", 5_000)
    assert (refused.ok, refused.reason) == (False, "tpm")
    assert gates.settle(ROUTE, "a", 2_500).tokens == 2_500  # 2,000 in + 500 out actually used
    assert gates.debit(ROUTE, "b", 5_000).tokens == 7_500
    # no usage evidence: the debit stays at its full amount
    assert gates.settle(ROUTE, "b", None).tokens == 7_500
    assert gates.reading(ROUTE).within_limits()


def test_concurrency_leases_expire_unless_renewed_and_free_at_settlement(
    make_gates: MakeGates, clock: ManualClock
) -> None:
    gates = make_gates(limits(concurrency=2))
    assert gates.debit(ROUTE, "a", 1).ok and gates.debit(ROUTE, "b", 1).ok
    assert gates.debit(ROUTE, "c", 1).reason == "concurrency"
    clock.advance(9)
    assert gates.renew(ROUTE, "a")  # a's holder is alive; b's holder died
    clock.advance(1)
    assert gates.reading(ROUTE).leases == 1  # b lapsed at 10 s
    assert not gates.renew(ROUTE, "b")  # too late: b must not send
    assert gates.debit(ROUTE, "c", 1).ok
    assert gates.debit(ROUTE, "d", 1).reason == "concurrency"
    assert gates.settle(ROUTE, "a", 1).leases == 1
    assert gates.debit(ROUTE, "d", 1).ok


def test_release_refunds_a_request_that_never_left(make_gates: MakeGates) -> None:
    gates = make_gates(limits(rpm=1, tpm=1_000, concurrency=1))
    assert gates.debit(ROUTE, "a", 900).ok
    assert not gates.debit(ROUTE, "b", 900).ok
    reading = gates.release(ROUTE, "a")
    assert (reading.requests, reading.tokens, reading.leases) == (0, 0, 0)
    assert gates.debit(ROUTE, "b", 900).ok
    assert not gates.release(ROUTE, "a").ok  # nothing left to release


def test_a_repeated_debit_under_one_lease_counts_once(make_gates: MakeGates) -> None:
    gates = make_gates(limits(rpm=5))
    assert gates.debit(ROUTE, "a", 100).reason == "ok"
    again = gates.debit(ROUTE, "a", 100)
    assert (again.ok, again.reason, again.requests, again.tokens) == (True, "repeat", 1, 100)


def test_a_429_with_retry_after_pauses_the_route_for_that_long(
    make_gates: MakeGates, clock: ManualClock
) -> None:
    gates = make_gates(limits(rpm=100, concurrency=4))
    assert gates.debit(ROUTE, "a", 100).ok
    reading = gates.after_reply(
        ROUTE,
        "a",
        used_tokens=None,
        rate_limits={"retry-after": "20"},
        retry_after_s=20.0,
        now_wall=0.0,
    )
    assert reading.leases == 0  # the slot is free while the trajectory waits READY
    assert reading.paused_until == pytest.approx(clock.now + 20)
    clock.advance(19.99)
    refused = gates.debit(ROUTE, "b", 100)
    assert (refused.ok, refused.reason) == (False, "paused")
    clock.advance(0.01)
    assert gates.debit(ROUTE, "b", 100).ok  # resumes
    # a shorter retry-after does not shorten a pause already in force
    gates.observe(ROUTE, Feedback(retry_after_s=30.0))
    gates.observe(ROUTE, Feedback(retry_after_s=1.0))
    clock.advance(29)
    assert gates.debit(ROUTE, "c", 100).reason == "paused"


def test_remaining_token_headers_lower_the_headroom_until_their_reset(
    make_gates: MakeGates, clock: ManualClock
) -> None:
    gates = make_gates(limits(tpm=100_000))
    headers = {"x-ratelimit-remaining-tokens": "5000", "x-ratelimit-reset-tokens": "6m0s"}
    reading = gates.observe(ROUTE, feedback_from(headers, None, now_wall=0.0))
    assert reading.remaining_tokens == 5_000
    assert reading.remaining_until == pytest.approx(clock.now + 360)
    assert gates.debit(ROUTE, "a", 4_000).ok
    refused = gates.debit(ROUTE, "b", 2_000)  # 96,000 left by tpm, 1,000 by the provider's word
    assert (refused.ok, refused.reason) == (False, "remaining_tokens")
    assert gates.debit(ROUTE, "b", 1_000).ok
    clock.advance(360)
    assert gates.debit(ROUTE, "c", 2_000).ok  # the provider's figure has reset


def test_remaining_requests_header_and_a_route_never_configured(make_gates: MakeGates) -> None:
    gates = make_gates(limits(rpm=100))
    gates.observe(ROUTE, Feedback(remaining_requests=1, reset_s=10))
    assert gates.debit(ROUTE, "a", 1).ok
    assert gates.debit(ROUTE, "b", 1).reason == "remaining_requests"
    unknown = gates.debit("other/model", "a", 1)
    assert (unknown.ok, unknown.reason) == (False, "unknown_route")


def test_safety_fraction_holds_back_part_of_rpm_and_tpm(make_gates: MakeGates) -> None:
    gates = make_gates(limits(rpm=10, tpm=1_000, safety_fraction=0.2))
    reading = gates.reading(ROUTE)
    assert (reading.rpm, reading.tpm, reading.concurrency) == (8, 800, -1)


def test_feedback_from_openai_and_anthropic_headers() -> None:
    openai = feedback_from(
        {
            "x-ratelimit-remaining-requests": "59",
            "x-ratelimit-remaining-tokens": "149000",
            "x-ratelimit-reset-requests": "1s",
            "x-ratelimit-reset-tokens": "1m30.5s",
        },
        None,
        now_wall=0.0,
    )
    assert openai == Feedback(None, 59, 149_000, 90.5)
    anthropic = feedback_from(
        {
            "anthropic-ratelimit-requests-remaining": "40",
            "anthropic-ratelimit-input-tokens-remaining": "30000",
            "anthropic-ratelimit-output-tokens-remaining": "8000",
            "anthropic-ratelimit-tokens-reset": "2024-01-01T00:01:00Z",
            "retry-after": "7",
        },
        7.0,
        now_wall=1_704_067_200.0,  # 2024-01-01T00:00:00Z
    )
    assert anthropic == Feedback(7.0, 40, 8_000, 60.0)
    assert feedback_from({"x-ratelimit-remaining-tokens": "lots"}, None, 0.0) == Feedback()
