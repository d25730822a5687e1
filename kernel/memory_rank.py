"""Ranking recalled facts by embeddings, combined with the text index (optional).

Where an embedder is configured (``REINS_EMBEDDINGS_URL``), a fact stores the embedding of its
text (:func:`fact_text`) packed in the item (:func:`pack`), and a recall re-ranks the text
index's best ``pool_size(limit)`` candidates by :func:`combined_score`, which weighs the text
index's tag overlap against the cosine similarity of the query's embedding and the fact's. The
text index still chooses the candidates (so visibility, expiry and the tag gate are the
store's, as without embeddings); embeddings only reorder them. Without an embedder, or when it
fails, recall is the text index's alone (``store.memory_base.MemoryBank.recall``).

Pure: no I/O; the embedder is called by ``worker.memory_tools``.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Iterable, Sequence

from kernel.errors import InvalidInput
from kernel.memory import MAX_EMBEDDING_CHARS, MemoryItem

#: The weight of the text index's score; the cosine similarity gets the rest.
TEXT_WEIGHT = 0.4
POOL_FACTOR = 4  # candidates re-ranked per item asked for
MAX_POOL = 100  # store.memory_base.MAX_RECALL


def pool_size(limit: int) -> int:
    """How many of the text index's best items a recall of ``limit`` re-ranks."""
    return min(MAX_POOL, max(limit, limit * POOL_FACTOR))


def fact_text(key: str, text: str, tags: Iterable[str]) -> str:
    """The text a fact's embedding is made of: its key, its value and its tags."""
    return " ".join([key.replace("_", " ").replace("-", " "), text, *tags])


def query_text(tags: Iterable[str], query: str | None) -> str:
    """The text a recall's embedding is made of: the free-text query, else its tags."""
    return query if query else " ".join(tags)


def pack(vector: Sequence[float]) -> str:
    """A vector as items store it: little-endian float32, base64 (refuses one too long or
    holding a value that is not a finite number)."""
    if not vector or not all(isinstance(x, int | float) and math.isfinite(x) for x in vector):
        raise InvalidInput("embedding: not a non-empty list of finite numbers", field="embedding")
    packed = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    if len(packed) > MAX_EMBEDDING_CHARS:
        raise InvalidInput(f"embedding: {len(vector)} dimensions is too many", field="embedding")
    return packed


def unpack(packed: str) -> tuple[float, ...]:
    """The vector :func:`pack` stored."""
    raw = base64.b64decode(packed)
    return struct.unpack(f"<{len(raw) // 4}f", raw)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity in [-1, 1]; 0 for vectors of different sizes or of zero length."""
    if len(a) != len(b):
        return 0.0
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(x * x for x in b))
    if na == 0 or nb == 0:
        return 0.0
    return sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb)


def combined_score(overlap: int, wanted: int, similarity: float) -> float:
    """The score a recall with embeddings ranks by, highest first::

        score = TEXT_WEIGHT * overlap / wanted + (1 - TEXT_WEIGHT) * max(similarity, 0)

    ``overlap / wanted`` is the text index's score (the share of the query's tags the fact
    has, in [0, 1]); ``similarity`` the cosine of the query's and the fact's embeddings, a
    negative one counting as 0 (unrelated). A fact stored without an embedding has similarity
    0, so it ranks by its tags alone. Ties: the newest, then the highest id (as the text index).
    """
    text = overlap / wanted if wanted > 0 else 0.0
    return TEXT_WEIGHT * text + (1 - TEXT_WEIGHT) * max(similarity, 0.0)


def rerank(
    items: Iterable[MemoryItem], wanted: Iterable[str], query: Sequence[float], limit: int
) -> list[MemoryItem]:
    """``items`` (the text index's candidates) ordered by :func:`combined_score`, best
    ``limit`` first."""
    tags = set(wanted)

    def key(item: MemoryItem) -> tuple[float, int, str]:
        similarity = cosine(query, unpack(item.embedding)) if item.embedding else 0.0
        score = combined_score(len(tags.intersection(item.tags)), len(tags), similarity)
        return (score, item.written_ms, item.item_id)

    return sorted(items, key=key, reverse=True)[:limit]
