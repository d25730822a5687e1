"""An OpenAI-compatible embeddings client: ``POST {base_url}/embeddings`` on a pooled route.

One call is one exchange on the route's :class:`~worker.providers.http.HttpPool` (the same
pooled, deadline-bounded connections the chat providers use), every wait bounded by
``timeout_s``. The request is ``{"model", "input": [texts]}``; the answer
``{"data": [{"embedding": [...], "index": i}], "usage": {...}}``, put back in input order.
Whatever goes wrong is raised as an :class:`EmbeddingFailed` with a code: ``embeddings_timeout``
(the deadline passed), ``embeddings_unavailable`` (refused, cut, 429 or 5xx),
``embeddings_refused`` (any other status) or ``embeddings_malformed`` (a 200 that does not
parse, or the wrong number of vectors). The caller falls back to the text index
(``worker.memory_tools``): an embedder's fault never fails a recall or a write.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kernel.errors import ReinsError
from kernel.settings import Settings
from worker.providers.http import HttpPool, PoolOptions, TransportError
from worker.providers.keys import KeyRef

MAX_BODY = 64 * 1024 * 1024  # a batch of large vectors as JSON text
MAX_ERROR_BODY = 4096


class EmbeddingFailed(ReinsError):
    """The embedder gave no usable vectors (the code says why; see the module docstring)."""

    code = "embeddings_failed"


class Embedder:
    """A client of one embeddings route; thread-safe. ``failures`` counts the calls that
    raised (what the fallback reports), ``calls`` every call."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout_s: float = 2.0,
        api_key: str | None = None,
        pool_options: PoolOptions | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.http = HttpPool(base_url, pool_options)
        self.base_url, self.model, self.timeout_s = base_url, model, timeout_s
        self._key, self.clock = api_key, clock
        self._lock = threading.Lock()
        self.calls = 0
        self.failures = 0

    @classmethod
    def from_settings(cls, settings: Settings, env: Mapping[str, str]) -> Embedder | None:
        """The embedder ``REINS_EMBEDDINGS_*`` configure; None when no URL is set."""
        if not settings.embeddings_url:
            return None
        key = KeyRef(env=settings.embeddings_api_key_env or None).resolve(env)
        return cls(
            settings.embeddings_url,
            settings.embeddings_model,
            timeout_s=settings.embeddings_timeout_s,
            api_key=key,
            pool_options=PoolOptions.from_settings(settings),
        )

    def __repr__(self) -> str:  # never the key
        return f"Embedder({self.base_url!r}, model={self.model!r})"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order; raises :class:`EmbeddingFailed` (never anything
        else) within ``timeout_s``."""
        with self._lock:
            self.calls += 1
        try:
            return self._embed(list(texts))
        except EmbeddingFailed:
            with self._lock:
                self.failures += 1
            raise

    def _embed(self, texts: list[str]) -> list[list[float]]:
        body = json.dumps({"model": self.model, "input": texts}).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        deadline = self.clock() + self.timeout_s
        try:
            with self.http.exchange(
                "/embeddings", body, headers, deadline=deadline, clock=self.clock
            ) as answer:
                if answer.status != 200:
                    text = answer.body.read(MAX_ERROR_BODY).decode("utf-8", "replace")
                    answer.body.drain()
                    code = (
                        "embeddings_unavailable"
                        if answer.status in (408, 429) or answer.status >= 500
                        else "embeddings_refused"
                    )
                    raise EmbeddingFailed(f"HTTP {answer.status}: {text[:200]}", code=code)
                raw = answer.body.read(MAX_BODY)
                answer.body.drain()
        except TransportError as exc:
            code = "embeddings_timeout" if exc.timed_out else "embeddings_unavailable"
            raise EmbeddingFailed(f"embeddings: {exc}", code=code) from None
        return _vectors(raw, len(texts))


def _vectors(raw: bytes, count: int) -> list[list[float]]:
    """The vectors of a 200 answer, in input order (``embeddings_malformed`` if it is not
    ``count`` equal-length vectors of finite numbers)."""

    def bad(why: str) -> EmbeddingFailed:
        return EmbeddingFailed(f"embeddings: {why}", code="embeddings_malformed")

    try:
        data: Any = json.loads(raw)["data"]
        pairs = sorted((int(d["index"]), d["embedding"]) for d in data)
    except (ValueError, KeyError, TypeError) as exc:
        raise bad(f"the answer does not parse ({exc!r}): {raw[:200]!r}") from None
    if [i for i, _ in pairs] != list(range(count)):
        raise bad(f"{len(pairs)} vectors for {count} inputs")
    vectors = [v for _, v in pairs]
    size = len(vectors[0]) if vectors else 0
    for v in vectors:
        if not isinstance(v, list) or len(v) != size or size == 0:
            raise bad("vectors of different or zero lengths")
        if not all(isinstance(x, int | float) and math.isfinite(x) for x in v):
            raise bad("a vector holds something that is not a finite number")
    return vectors
