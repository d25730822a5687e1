"""What a provider's reply says about its quota: remaining requests and tokens, their reset, and
retry-after, read from OpenAI (``x-ratelimit-*``) and Anthropic (``anthropic-ratelimit-*``) headers.
The provider layer (``worker/providers/headers.py``) keeps the headers and parses ``retry-after``;
:func:`feedback_from` turns them into what a gate applies
(:meth:`router.admission.gates.ProviderGates.observe`). Durations are read here again, in the
router's own small parser, so the router does not depend on the worker package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Feedback:
    """What a reply said about the provider's quota; -1 (or None) where it said nothing."""

    retry_after_s: float | None = None
    remaining_requests: int = -1
    remaining_tokens: int = -1
    reset_s: float | None = None


def feedback_from(
    rate_limits: Mapping[str, str], retry_after_s: float | None, now_wall: float
) -> Feedback:
    """Read OpenAI (``x-ratelimit-*``) and Anthropic (``anthropic-ratelimit-*``) headers.

    ``retry_after_s`` is the provider layer's parse of ``retry-after`` (ModelReply carries it).
    Remaining tokens is the smallest token figure reported (Anthropic reports input and output
    apart); the reset is the longest one reported, so the lowered headroom lasts long enough.
    ``now_wall`` (epoch seconds) turns Anthropic's RFC 3339 reset times into durations.
    """
    headers = {k.lower(): v for k, v in rate_limits.items()}
    requests: list[int] = []
    tokens: list[int] = []
    resets: list[float] = []
    for name, value in headers.items():
        if name.startswith("x-ratelimit-remaining-"):
            kind = name.removeprefix("x-ratelimit-remaining-")
        elif name.startswith("anthropic-ratelimit-") and name.endswith("-remaining"):
            kind = name.removeprefix("anthropic-ratelimit-").removesuffix("-remaining")
        elif name.startswith("x-ratelimit-reset-") or (
            name.startswith("anthropic-ratelimit-") and name.endswith("-reset")
        ):
            reset = _seconds_until(value, now_wall)
            if reset is not None:
                resets.append(reset)
            continue
        else:
            continue
        count = _count(value)
        if count is None:
            continue
        if kind == "requests":
            requests.append(count)
        elif kind.endswith("tokens"):
            tokens.append(count)
    return Feedback(
        retry_after_s=retry_after_s,
        remaining_requests=min(requests, default=-1),
        remaining_tokens=min(tokens, default=-1),
        reset_s=max(resets) if resets else None,
    )


def _count(value: str) -> int | None:
    try:
        return max(int(value.strip()), 0)
    except ValueError:
        return None


_UNITS = (("ms", 0.001), ("h", 3600.0), ("m", 60.0), ("s", 1.0))


def _seconds_until(value: str, now_wall: float) -> float | None:
    """``"20"``, ``"1.5s"``, ``"6m0s"``, ``"120ms"`` or an RFC 3339 time; None if unreadable."""
    text = value.strip()
    try:
        return max(float(text), 0.0)
    except ValueError:
        pass
    total, rest = 0.0, text
    while rest:
        number = ""
        while rest and (rest[0].isdigit() or rest[0] == "."):
            number, rest = number + rest[0], rest[1:]
        unit = next((u for u in _UNITS if rest.startswith(u[0])), None)
        if not number or unit is None:
            break
        total, rest = total + float(number) * unit[1], rest[len(unit[0]) :]
    else:
        return total
    try:
        return max(datetime.fromisoformat(text).timestamp() - now_wall, 0.0)
    except ValueError:
        return None
