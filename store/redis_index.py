"""Pages of a tenant's state index on Redis, continued after the last id seen.

The index is :data:`~store.redis_keys.INDEX_BUCKETS` sorted sets per tenant (score: the state
code, member: the trajectory id; :mod:`store.redis_keys`). A walk of one state takes the
buckets in order and each bucket in id order, so an id has one fixed place in it: the order of
(:func:`~store.redis_keys.bucket_of` the id, the id). A page is the ids after a given one, read
by ``lua/index_page.lua``: its cost follows the page, not how far into the index it starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis

from store.redis_direct import direct_batch
from store.redis_keys import INDEX_BUCKETS, bucket_of
from store.scripts import run_batch, scripts_beside

SCRIPTS = scripts_beside(__file__)


class IndexPager:
    """Reads pages of one state of a tenant's index; ``read`` is a store's retrying read."""

    def __init__(self, client: redis.Redis, read: Callable[[str, Callable[[], Any]], Any]):
        self._client = client
        self._read = read
        self._script = SCRIPTS("index_page.lua")
        #: Ids the scripts returned, all pages together: what the pages read, for the tests.
        self.ids_read = 0

    def page(self, keys: Sequence[str], what: str, code: int, after: str, limit: int) -> list[str]:
        """Up to ``limit`` ids of state ``code`` strictly after ``after`` ("" from the first)
        in the walk's order; fewer than ``limit`` when the walk is done. Two round trips at
        most: the rest of ``after``'s bucket, then (if the page is not full) the buckets past
        it from their first id, each asked for what the page still lacks."""
        first = bucket_of(after) if after else 0
        ids = self._buckets(what, [(keys[first], code, after, limit)])[0]
        if len(ids) < limit and first + 1 < INDEX_BUCKETS:
            rest = [(keys[b], code, "", limit - len(ids)) for b in range(first + 1, INDEX_BUCKETS)]
            for more in self._buckets(what, rest):
                ids += more[: limit - len(ids)]
        return ids

    def _buckets(self, what: str, calls: list[tuple[str, int, str, int]]) -> list[list[str]]:
        """index_page.lua on each bucket, sent together (grouped by node on a cluster)."""

        def send() -> list[Any]:
            batch = direct_batch(self._client)
            for key, code, after, count in calls:
                batch.execute_command(*self._script.command([key], [code, after, count]))
            return batch.execute(raise_on_error=False)

        def run() -> list[Any]:
            return run_batch(self._client, send, [self._script])

        pages = [_ids(r) for r in self._read(what, run)]
        self.ids_read += sum(len(p) for p in pages)
        return pages


def _ids(reply: Any) -> list[str]:
    return [m.decode() if isinstance(m, bytes) else str(m) for m in reply]
