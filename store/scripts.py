"""Lua scripts: each package's ``lua/`` folder read once, each script run by ``EVALSHA``.

Every Redis user in reins runs its scripts through here: the store, the router's admitter,
placement, the wire and the router process. A script is its library files and then its main
file, joined; its SHA1 names it on the server. A server that lost its scripts (restarted or
flushed) answers ``NOSCRIPT``: the script is loaded (on every primary of a cluster) and the call
is sent once more. In a batch, scripts go as bare ``EVALSHA`` (a redis-py script object would
ask ``SCRIPT EXISTS`` before every pipeline, a round trip each), and :func:`run_batch` loads
them and sends the batch again when a reply says ``NOSCRIPT``.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.exceptions import NoScriptError, RedisError

from kernel.errors import StoreError, StoreUnavailable
from store.redis_client import TRANSIENT, retry_transient
from store.redis_direct import direct_command

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Script:
    """One script as the server knows it: its source and the SHA1 that names it; ``files`` it
    is made of, ``name`` the last (its main file)."""

    name: str
    source: str
    sha: str
    files: tuple[str, ...] = ()

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The bare ``EVALSHA`` of this script, for a batch or a command function."""
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def load(self, client: redis.Redis) -> None:
        """``SCRIPT LOAD`` it (a cluster client sends it to every primary)."""
        client.script_load(self.source)

    def run(
        self,
        client: redis.Redis,
        keys: Sequence[Any],
        args: Sequence[Any],
        execute: Callable[..., Any] | None = None,
    ) -> Any:
        """Run it once on ``client`` (through ``execute``, a command function of the client,
        when given); on ``NOSCRIPT`` load it and run it once more. Errors are redis-py's."""
        send = execute or client.execute_command
        try:
            return send(*self.command(keys, args))
        except NoScriptError:
            self.load(client)
            return send(*self.command(keys, args))


class Scripts:
    """The ``.lua`` files of one folder, each read once; scripts made of them, each built once."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._built: dict[tuple[str, ...], Script] = {}
        self._files: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, *files: str) -> Script:
        """The script made of ``files`` in order: library files first, the main file last."""
        script = self._built.get(files)
        if script is None:
            with self._lock:
                source = "\n".join(self._read(name) for name in files)
                sha = hashlib.sha1(source.encode()).hexdigest()
                script = Script(files[-1], source, sha, files)
                self._built[files] = script
        return script

    def _read(self, name: str) -> str:
        text = self._files.get(name)
        if text is None:
            text = self._files[name] = (self.folder / name).read_text(encoding="utf-8")
        return text


@functools.cache
def scripts_in(folder: str) -> Scripts:
    """The scripts of ``folder``; one object per folder and process."""
    return Scripts(Path(folder))


def scripts_beside(module_file: str) -> Scripts:
    """The scripts in the ``lua/`` folder beside the module at ``module_file``."""
    return scripts_in(str(Path(module_file).resolve().parent / "lua"))


def run_batch(
    client: redis.Redis, send: Callable[[], list[Any]], scripts: Sequence[Script]
) -> list[Any]:
    """The replies of the batch ``send`` executes (with ``raise_on_error=False``), in which
    ``scripts`` run as bare ``EVALSHA``: if any reply is ``NOSCRIPT`` they are loaded and the
    batch is sent once more (so every command in it must be safe to repeat). Any other error
    reply is raised."""
    replies = send()
    if any(isinstance(r, NoScriptError) for r in replies):
        for script in scripts:
            script.load(client)
        replies = send()
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


class LuaScript:
    """A script bound to a client, on the hot path's direct connection, with reins's errors.

    Redis errors become :class:`StoreError`; an unreachable server, :class:`StoreUnavailable`.
    A call marked ``retry`` (the script is idempotent) is retried after a lost reply.
    """

    def __init__(self, client: redis.Redis, script: Script, *, attempts: int = 4) -> None:
        self.client = client
        self.script = script
        self.sha, self.source = script.sha, script.source
        self._attempts = attempts
        self._execute: Callable[..., Any] = direct_command(client)

    def __call__(self, keys: Sequence[Any], args: Sequence[Any], *, retry: bool) -> Any:
        """Run it; ``retry``: the script is idempotent, so a lost reply may be retried."""
        name = self.script.name
        try:
            return self._once(keys, args)
        except TRANSIENT as exc:
            if not retry:
                raise StoreUnavailable(
                    f"{name}: Redis unreachable, outcome unknown ({exc})"
                ) from exc
            return self._retrying(lambda: self._once(keys, args))
        except RedisError as exc:
            raise StoreError(f"{name}: {exc}") from exc

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The bare ``EVALSHA`` of this script, for a batch."""
        return self.script.command(keys, args)

    def _once(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        return self.script.run(self.client, keys, args, self._execute)

    def _retrying(self, fn: Callable[[], _T]) -> _T:
        # the first attempt already failed in __call__
        name = self.script.name
        return retry_transient(fn, what=name, attempts=self._attempts - 1, counted=self._attempts)
