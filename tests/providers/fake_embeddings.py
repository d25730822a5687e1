"""The OpenAI embeddings encoding, for the loopback server: deterministic vectors.

``POST /v1/embeddings`` takes ``{"model", "input"}`` (a text or a list of texts) and answers
``{"object": "list", "data": [{"object": "embedding", "embedding": [...], "index": i}],
"model", "usage": {"prompt_tokens", "total_tokens"}}``. A text's vector is a hashed bag of its
words' character trigrams (each word padded with spaces), projected to :data:`DIMENSIONS` and
normalised: texts that share word stems ("refund", "refunds", "refunding") are near even when
no whole word is shared, and texts that share nothing are near orthogonal. The script's
:class:`~tests.providers.fake_replies.Reply` still decides status, errors and pacing.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

from tests.providers.fake_openai import error_body  # noqa: F401 - the server asks this module

PATH = "/v1/embeddings"
DIMENSIONS = 256
_WORD = re.compile(r"[a-z0-9]+")


def embed(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """The deterministic vector of ``text`` (see the module docstring)."""
    vector = [0.0] * dimensions
    for word in _WORD.findall(text.lower()):
        padded = f" {word} "
        for i in range(len(padded) - 2):
            digest = hashlib.blake2b(padded[i : i + 3].encode(), digest_size=8).digest()
            slot = int.from_bytes(digest[:4], "little") % dimensions
            vector[slot] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [round(x / norm, 6) for x in vector] if norm else vector


def event_name(payload: str) -> str | None:
    """Not a stream: no events."""
    return None


def body_of(request: dict[str, Any]) -> dict[str, Any]:
    """The whole answer to an embeddings request."""
    texts = request.get("input")
    texts = [texts] if isinstance(texts, str) else list(texts or [])
    tokens = sum(len(str(t).split()) for t in texts)
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "embedding": embed(str(t)), "index": i}
            for i, t in enumerate(texts)
        ],
        "model": request.get("model", "fake-embed"),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
