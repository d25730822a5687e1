"""Bounded retries of transport failures, each one a new attempt registered before it is sent.

The provider never retries by itself. Reins today leaves retries to the kernel: a
TRANSPORT_FAILURE reply is folded into a recoverable observation, and the next admission
registers (and reserves) a new call before it is sent. :func:`call_with_retries` is the helper
for a runner that can register a further attempt of the same call: it re-sends only after
``register_attempt`` has committed that attempt, and only for a transport failure that did not
run out the deadline (a 429 or a refusal is never retried here: the quota gate decides).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_exponential
from tenacity.wait import wait_base

from kernel.events import ReplyStatus
from worker.models import ModelReply


class _NotRegistered(Exception):
    """The caller refused to register a further attempt: nothing more is sent."""


def retryable(reply: ModelReply) -> bool:
    """A transport failure with time left: the request may not have reached the model."""
    return reply.status is ReplyStatus.TRANSPORT_FAILURE and not reply.timed_out


def call_with_retries(
    send: Callable[[int], ModelReply],
    register_attempt: Callable[[int], bool],
    *,
    max_attempts: int = 3,
    wait: wait_base | None = None,
) -> list[ModelReply]:
    """Send attempt 1 (registered by the caller's admission already), then, while the reply
    is :func:`retryable` and fewer than ``max_attempts`` were sent, register attempt n with
    ``register_attempt(n)`` and send it only if that returned True.

    Returns every attempt's reply in order (each is evidence for its own attempt); the last
    one is the outcome.
    """
    replies: list[ModelReply] = []

    def once() -> ModelReply:
        n = len(replies) + 1
        if n > 1 and not register_attempt(n):
            raise _NotRegistered
        reply = send(n)
        replies.append(reply)
        return reply

    retrying = Retrying(
        stop=stop_after_attempt(max_attempts),
        wait=wait if wait is not None else wait_exponential(multiplier=0.2, max=2.0),
        retry=retry_if_result(retryable),
        retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
    )
    with contextlib.suppress(_NotRegistered):
        retrying(once)
    return replies
