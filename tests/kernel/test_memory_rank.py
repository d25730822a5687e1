"""The combination of the text index's score and the embeddings' cosine similarity
(``kernel.memory_rank``): the formula, and the order it gives."""

from __future__ import annotations

import math

import pytest

from kernel.errors import InvalidInput
from kernel.memory import MemoryItem, MemoryKind, Scope
from kernel.memory_rank import TEXT_WEIGHT, combined_score, cosine, pack, pool_size, rerank, unpack


def fact(key: str, tags: list[str], vector: list[float] | None, written_ms: int = 1) -> MemoryItem:
    return MemoryItem(
        kind=MemoryKind.FACT,
        tenant="acme",
        scope=Scope.USER,
        subject="cu_ana",
        key=key,
        value={"text": key},
        tags=tags,
        written_ms=written_ms,
        embedding=None if vector is None else pack(vector),
    )


def test_the_score_is_the_stated_weighted_sum() -> None:
    assert combined_score(2, 4, 0.5) == pytest.approx(TEXT_WEIGHT * 0.5 + (1 - TEXT_WEIGHT) * 0.5)
    assert combined_score(1, 1, 1.0) == pytest.approx(1.0)
    assert combined_score(0, 3, 0.0) == 0.0
    assert combined_score(3, 3, -0.9) == pytest.approx(TEXT_WEIGHT)  # a negative cosine is 0


def test_a_near_fact_outranks_a_newer_one_with_the_same_tags() -> None:
    near = fact("near", ["refund"], [1.0, 0.0], written_ms=1)
    far = fact("far", ["refund"], [0.0, 1.0], written_ms=2)
    assert [i.key for i in rerank([far, near], ["refund"], [1.0, 0.1], 2)] == ["near", "far"]


def test_the_text_index_still_counts_when_similarities_are_equal() -> None:
    more = fact("more", ["a", "b"], [1.0, 0.0], written_ms=1)
    fewer = fact("fewer", ["a"], [1.0, 0.0], written_ms=2)
    assert [i.key for i in rerank([fewer, more], ["a", "b"], [1.0, 0.0], 2)] == ["more", "fewer"]


def test_an_opposite_vector_counts_as_unrelated_not_worse() -> None:
    opposite = fact("opposite", ["a"], [-1.0, 0.0], written_ms=2)
    bare = fact("bare", ["a"], None, written_ms=1)  # stored without an embedding
    ranked = rerank([bare, opposite], ["a"], [1.0, 0.0], 2)
    assert [i.key for i in ranked] == ["opposite", "bare"]  # equal scores: the newer first


def test_a_fact_without_an_embedding_ranks_by_its_tags_and_the_limit_holds() -> None:
    items = [fact(f"f{n}", ["a", "b"][: 1 + n % 2], None, written_ms=n) for n in range(6)]
    ranked = rerank(items, ["a", "b"], [1.0], 3)
    assert [i.key for i in ranked] == ["f5", "f3", "f1"]


def test_vectors_round_trip_and_bad_ones_are_refused() -> None:
    assert unpack(pack([0.5, -1.0, 2.0])) == (0.5, -1.0, 2.0)
    assert cosine([1.0, 0.0], [1.0]) == 0.0  # different sizes: unrelated
    assert cosine([0.0, 0.0], [1.0, 0.0]) == 0.0
    for bad in ([], [math.nan], [math.inf]):
        with pytest.raises(InvalidInput, match="embedding"):
            pack(bad)
    with pytest.raises(InvalidInput, match="too many"):
        pack([0.1] * 20_000)
    assert pool_size(5) == 20 and pool_size(100) == 100
