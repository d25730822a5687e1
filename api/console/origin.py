"""Where the console's forms may come from: its own origin, the configured public URL's
(``REINS_PUBLIC_URL``) or, without one, the address the request names (its scheme from a
trusted proxy only: :mod:`api.app`). A form from any other origin is cross-site request forgery
and is refused before anything is read."""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import Request

from api.auth import front_of
from api.problems import Problem


def origin_of(url: str) -> str | None:
    """The origin of ``url`` as a browser writes it (``scheme://host[:port]``, lower case, no
    default port); None when it has none (not http or https, or no host)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + (f":{port}" if port not in (None, default) else "")


def console_origin(request: Request) -> str | None:
    """The console's own origin: the public URL's when one is set, else the request's."""
    return front_of(request).settings.public_url or origin_of(str(request.url))


def over_https(request: Request) -> bool:
    """Whether people reach the console over HTTPS (its cookie is ``Secure`` then)."""
    return (console_origin(request) or "").startswith("https://")


def same_origin(request: Request) -> None:
    """A 403 for a form posted by a page of another origin (cross-site request forgery):
    ``Sec-Fetch-Site: cross-site``, an ``Origin`` not the console's, or, when a browser sent
    no ``Origin``, a ``Referer`` of another origin. A request with neither header is no
    browser's form (the cookie is ``SameSite=Strict`` besides)."""
    mine = console_origin(request)
    origin = request.headers.get("origin")
    referer = request.headers.get("referer")
    if (
        request.headers.get("sec-fetch-site") == "cross-site"
        or (origin is not None and origin_of(origin) != mine)
        or (origin is None and referer is not None and origin_of(referer) != mine)
    ):
        raise Problem(403, "Forbidden", "a console form must be sent from the console's own pages")
