"""What a provider's response headers say: rate limits, retry-after, reported latency.

The quota gate (router) reads ``retry_after_s`` and the rate-limit headers (OpenAI's
``x-ratelimit-*``, Anthropic's ``anthropic-ratelimit-*``) from the reply; the provider only
reports them and never sleeps on them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import datetime
from email.utils import parsedate_to_datetime

RATE_LIMIT_PREFIX = "x-ratelimit-"
ANTHROPIC_PREFIX = "anthropic-ratelimit-"
RETRY_HEADERS = ("retry-after-ms", "retry-after")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def rate_limit_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The ``x-ratelimit-*``, ``anthropic-ratelimit-*`` and retry-after headers seen (names
    lower-cased)."""
    return {
        k: v
        for k, v in headers.items()
        if k.startswith((RATE_LIMIT_PREFIX, ANTHROPIC_PREFIX)) or k in RETRY_HEADERS
    }


def duration_s(text: str) -> float | None:
    """Seconds in a header value: ``"20"``, ``"1.5s"``, ``"6m0s"``, ``"120ms"``; None if not."""
    text = text.strip()
    try:
        return max(float(text), 0.0)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT[u] for n, u in parts)


def retry_after(headers: Mapping[str, str], rejected: bool) -> float | None:
    """Seconds to wait before asking again, from ``retry-after-ms``, then ``retry-after``
    (seconds or an HTTP date); for a rejected call without either, the longest reset of its
    rate-limit headers (``x-ratelimit-reset-*`` durations, ``anthropic-ratelimit-*-reset``
    RFC 3339 times)."""
    if "retry-after-ms" in headers:
        ms = duration_s(headers["retry-after-ms"])
        if ms is not None:
            return ms / 1000
    if "retry-after" in headers:
        value = headers["retry-after"]
        secs = duration_s(value)
        if secs is not None:
            return secs
        try:
            return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
        except (TypeError, ValueError):
            pass
    if not rejected:
        return None
    resets = [
        d
        for k, v in headers.items()
        if k.startswith(RATE_LIMIT_PREFIX + "reset") and (d := duration_s(v)) is not None
    ]
    resets += [
        d
        for k, v in headers.items()
        if k.startswith(ANTHROPIC_PREFIX) and k.endswith("-reset") and (d := _until(v)) is not None
    ]
    return max(resets) if resets else None


def _until(stamp: str) -> float | None:
    """Seconds from now to an RFC 3339 time; None if it is not one."""
    try:
        return max(datetime.fromisoformat(stamp.strip()).timestamp() - time.time(), 0.0)
    except ValueError:
        return None


def latency_from(headers: Mapping[str, str], name: str | None) -> float | None:
    """The server's reported processing time in seconds, from a header in milliseconds."""
    if not name or name.lower() not in headers:
        return None
    ms = duration_s(headers[name.lower()])
    return ms / 1000 if ms is not None else None
