"""JSON text for the model's view and for digests, from encoders built once.

``JSONEncoder.encode`` builds its C encoder again on every call; for the small values the
kernel encodes on every step (a view per model call, a digest per turn) that setup is about
a third of the cost. These encoders are built once and give exactly the text of
``json.dumps`` with the same options. Neither checks for cycles: their input is JSON data.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Encode = Callable[[Any], str]


def _build(
    separators: tuple[str, str], default: Callable[[Any], Any], sort_keys: bool = True
) -> Encode:
    item_sep, key_sep = separators
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator (not CPython): the library's own path, same text
        encoder = json.JSONEncoder(
            sort_keys=sort_keys, separators=separators, default=default, check_circular=False
        )
        return encoder.encode
    # The arguments JSONEncoder.iterencode passes for these options, in its order.
    chunks = make(
        None,  # markers: no check for cycles
        default,
        json.encoder.encode_basestring_ascii,  # ensure_ascii
        None,  # indent
        key_sep,
        item_sep,
        sort_keys,
        False,  # skipkeys
        True,  # allow_nan
    )

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    return encode


# ``json.dumps(value, sort_keys=True)``: the model's view and the size of a tool result.
sorted_text: Encode = _build((", ", ": "), json.JSONEncoder().default)

# ``json.dumps(value)``: a scripted model's reply text, whose length is its output tokens.
plain_text: Encode = _build((", ", ": "), json.JSONEncoder().default, sort_keys=False)

# ``json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)``: what is digested.
canonical_text: Encode = _build((",", ":"), str)
