"""Commit ids are unique: within a process, across threads, and in a forked child."""

from __future__ import annotations

import os
import re
import threading

from store.base import new_commit_id


def test_commit_ids_are_32_hex_digits_and_never_repeat() -> None:
    ids = [new_commit_id() for _ in range(10_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_threads_drawing_at_once_get_distinct_ids() -> None:
    drawn: list[list[str]] = [[] for _ in range(4)]

    def draw(out: list[str]) -> None:
        out.extend(new_commit_id() for _ in range(2_000))

    threads = [threading.Thread(target=draw, args=(out,)) for out in drawn]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for out in drawn for i in out]
    assert len(set(every)) == len(every)


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    new_commit_id()  # the parent has drawn its prefix
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, new_commit_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = new_commit_id()
    assert len(child) == 32 and child[:16] != parent[:16]
