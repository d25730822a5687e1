"""Persistence behind small protocols (:mod:`store.base`): Redis for the fleet
(:mod:`store.redis_store`), SQLite as the embedded default (:mod:`store.sqlite`), and an
in-memory backend for tests (:mod:`store.in_process`). One contract suite runs against all three.
"""
