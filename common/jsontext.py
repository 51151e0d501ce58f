"""The JSON decoder of the API server's watch events, lists and errors, and of saved cluster state.

(The webhook's AdmissionReview and Prometheus' answers are decoded by orjson directly, `admission/review.py` and
`common/prometheus.py`: neither is kept as cluster state, and no field of theirs that could hold an integer
beyond 64 bits is written back.)

`loads(data)` returns exactly what the standard library's `json.loads(data)` returns, and raises what it raises,
at orjson's speed where the two agree (a pod watch event decodes 2-3x faster: `benchmarks/watch_decode.py`).
They agree on every document orjson accepts, except one: orjson turns an integer beyond 64 bits into a float
(json keeps it exact). A document with 19 or more digits in a row anywhere (in a number, or by chance in a
string such as an image digest) therefore goes to json; so does every document orjson refuses (NaN and
Infinity, numbers beyond a double, lone surrogates, a byte-order mark, nesting deeper than 1024, text that is
not JSON), and json decides: the same object, or the same `ValueError` with the same message.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

# Digits to b"0", everything else to b" ": a run of 19 digits becomes a run of 19 b"0" bytes. Integers of up to
# 18 digits lie within int64; orjson keeps integers exact up to the unsigned 64-bit maximum (20 digits).
_DIGITS_AS_ZERO = bytes(ord("0") if ord("0") <= byte <= ord("9") else ord(" ") for byte in range(256))
_LONG_RUN = b"0" * 19


def loads(data: bytes | str) -> Any:
    """`json.loads(data)`: the same value or the same `ValueError` (see the module's docstring)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if _LONG_RUN not in raw.translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # json decides, with its own message
    return json.loads(data)
