"""Provider keys, resolved from the reference a profile or route names: never stored, never shown.

A key is named by the environment variable that holds it (``api_key_env``) or by the path of a
mounted file (``api_key_file``: a Kubernetes secret volume), and read on the worker that calls
the provider. :class:`KeyRef` is what may be written down, logged or shown: the reference, never
the key. A reference that does not resolve is a :class:`ProviderConfigError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from worker.providers.base import ProviderConfigError

MAX_KEY_FILE = 64 * 1024


@dataclass(frozen=True, slots=True)
class KeyRef:
    """Where a provider's key is: an environment variable, a file, or nowhere (no key)."""

    env: str | None = None
    file: str | None = None

    def __str__(self) -> str:
        if self.env:
            return f"${self.env}"
        return f"file {self.file}" if self.file else "no key"

    def resolve(self, env: Mapping[str, str]) -> str | None:
        """The key (None when the reference names none); raises
        :class:`ProviderConfigError` naming the reference when it does not resolve."""
        if self.env:
            value = env.get(self.env, "").strip()
            if not value:
                raise ProviderConfigError(f"{self.env} is not set", field="api_key_env")
            return value
        if self.file:
            try:
                text = Path(self.file).read_text(encoding="utf-8")[:MAX_KEY_FILE].strip()
            except OSError as exc:
                raise ProviderConfigError(
                    f"key file {self.file} cannot be read ({exc.strerror})", field="api_key_file"
                ) from None
            if not text:
                raise ProviderConfigError(f"key file {self.file} is empty", field="api_key_file")
            return text
        return None

    def problem(self, env: Mapping[str, str]) -> str | None:
        """Why the reference does not resolve here, or None when it does."""
        try:
            self.resolve(env)
        except ProviderConfigError as exc:
            return str(exc)
        return None
