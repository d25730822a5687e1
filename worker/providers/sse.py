"""Server-sent events as both provider protocols stream them: the ``data`` of each event.

Chat completions end with ``data: [DONE]``; Anthropic's Messages stream ends with a
``message_stop`` event. Either way the reader stops at its own end marker: :func:`sse_payloads`
only cuts the stream into payloads and says when it ended before that (:class:`StreamCut`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

MAX_LINE = 1 << 20
PARTIAL_CHARS = 4000  # a canceled or cut stream keeps this much for diagnosis


class ProtocolError(Exception):
    """The far side sent something that is not the provider's protocol."""


class StreamCut(Exception):
    """The stream ended (EOF) before its end marker."""


def sse_payloads(readline: Callable[[int], bytes]) -> Iterator[str]:
    """Yield the ``data`` of each server-sent event, in order, until the caller stops.

    Raises :class:`StreamCut` at EOF and :class:`ProtocolError` for a line that is not UTF-8 or
    is longer than ``MAX_LINE``. Comment lines (keep-alives) and ``event:`` names are skipped:
    both protocols repeat the event's type inside its data.
    """
    data: list[str] = []
    while True:
        raw = readline(MAX_LINE + 1)
        if not raw:
            raise StreamCut("the stream ended before its end marker")
        if len(raw) > MAX_LINE:
            raise ProtocolError("an event-stream line is longer than 1 MiB")
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            raise ProtocolError("an event-stream line is not UTF-8") from None
        if line == "":
            if data:
                payload = "\n".join(data)
                data = []
                yield payload
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
