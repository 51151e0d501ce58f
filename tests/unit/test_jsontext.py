"""`jsontext.loads` decodes exactly as the standard library's `json.loads` does, and `kube._event` (every watch line)
through it: real watch lines recorded from kube-apiserver 1.37 (tests/fixtures/watch/), the documents where orjson
and json part ways (integers beyond 64 bits, NaN, lone surrogates, a byte-order mark), malformed lines, and random
documents (hypothesis). Values are compared by `repr` too, so that 1 and 1.0, or 0.0 and -0.0, differ."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from common import jsontext, kube

WATCH = pathlib.Path(__file__).parent.parent / "fixtures" / "watch"
# What kube-apiserver sends when the resourceVersion is compacted away (apimachinery's errors.NewResourceExpired).
GONE = (b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
        b'"message":"too old resource version: 1 (263)","reason":"Expired","code":410}}')


def recorded(name: str) -> list[bytes]:
    return [line for line in (WATCH / name).read_bytes().splitlines() if line.strip()]


PODS, NODES = recorded("pods.jsonl"), recorded("nodes.jsonl")
MODIFIED = PODS[3]  # the pod running on its node (status, conditions, two managedFields entries)


def grace(value: str) -> bytes:
    """The recorded pod with `terminationGracePeriodSeconds` (an int64 in the API) set to the number `value`."""
    line, count = re.subn(rb'"terminationGracePeriodSeconds":30,"dnsPolicy"',
                          b'"terminationGracePeriodSeconds":' + value.encode() + b',"dnsPolicy"', MODIFIED)
    assert count == 1
    return line


def same(got: Any, want: Any) -> None:
    assert got == want or (got != got and want != want)  # NaN is not equal to itself
    assert repr(got) == repr(want)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(PODS[0], id="pod-bookmark"),
        pytest.param(PODS[1], id="pod-added-unicode-and-escapes"),
        pytest.param(PODS[2], id="pod-modified-scheduled"),
        pytest.param(PODS[3], id="pod-modified-running"),
        pytest.param(PODS[4], id="pod-modified-deleting"),
        pytest.param(PODS[5], id="pod-deleted"),
        pytest.param(NODES[0], id="node-added"),
        pytest.param(NODES[1], id="node-bookmark"),
        pytest.param(GONE, id="error-410-gone"),
        pytest.param(grace("18446744073709551616"), id="int-beyond-uint64-stays-exact"),
        pytest.param(grace("-9223372036854775809"), id="19-digit-int-beyond-int64-stays-exact"),
        pytest.param(grace("18446744073709551615"), id="uint64-max"),
        pytest.param(grace("9223372036854775807"), id="int64-max"),
        pytest.param(grace("999999999999999999"), id="18-digits"),
        pytest.param(grace("123456789012345678901234567890"), id="30-digit-int"),
        pytest.param(grace("1e400"), id="beyond-double-is-infinity"),
        pytest.param(grace("NaN"), id="nan"),
        pytest.param(grace("-0.0"), id="negative-zero"),
        pytest.param(grace("30.000000000000000000001"), id="long-fraction"),
        pytest.param(MODIFIED.replace(b"recolte", b"\\ud800"), id="lone-surrogate-escape"),
        pytest.param(b"\xef\xbb\xbf" + MODIFIED, id="byte-order-mark"),
    ],
)
def test_watch_lines_decode_as_json_does(line: bytes) -> None:
    same(kube._event(line), json.loads(line))


def test_the_rows_cover_both_decoders() -> None:
    """Recorded lines without a long digit run are orjson's to decode (and it agrees); a big integer is not."""
    fast = [line for line in [*PODS, *NODES, GONE] if b"9223372036854775808" not in line]
    assert len(fast) == 4 and all(repr(orjson.loads(line)) == repr(json.loads(line)) for line in fast)
    big = grace("18446744073709551616")
    assert repr(orjson.loads(big)) != repr(json.loads(big))  # 1.8446744073709552e+19: why json decides those


@pytest.mark.parametrize(
    ("line", "message"),
    [
        pytest.param(MODIFIED[:2000], r"watch event is not JSON: Unterminated string .*: b'\{\"type\":\"MODIFIED\"",
                     id="truncated"),
        pytest.param(MODIFIED.replace(b"recolte", b"r\xe9colte"), r"watch event is not JSON: 'utf-8' codec can't "
                     r"decode byte 0xe9 .*: b'\{\"type\":\"MODIFIED\"", id="invalid-utf8"),
        pytest.param(MODIFIED + b"}", r"watch event is not JSON: Extra data: line 1 column \d+", id="extra-data"),
        pytest.param(b"<html>proxy error</html>", r"watch event is not JSON: Expecting value: line 1 column 1 "
                     r"\(char 0\): b'<html>proxy error</html>'", id="html"),
        pytest.param(b'{"type":"ADDED"}', r"watch event without an object: b'\{\"type\":\"ADDED\"\}'", id="no-object"),
        pytest.param(b"[1,2]", r"watch event without an object: b'\[1,2\]'", id="not-an-object"),
    ],
)
def test_malformed_lines_raise_api_error_naming_the_line(line: bytes, message: str) -> None:
    with pytest.raises(kube.ApiError, match=message) as raised:
        kube._event(line)
    assert raised.value.status == 0  # the feeder counts it in gpu_steward_feeder_errors and watches again


@pytest.mark.parametrize(
    ("document", "by_json"),
    [
        pytest.param(MODIFIED.replace(b"9223372036854775808", b"922337203685477580"), False, id="18-digits-orjson"),
        pytest.param(MODIFIED, True, id="19-digits-json"),
        pytest.param(b'{"a": [1, 2.5, "x"]}', False, id="plain-orjson"),
        pytest.param(b'{"a": "1234567890", "b": "123456789"}', False, id="two-short-runs-orjson"),
        pytest.param(b'{"a": NaN}', True, id="refused-by-orjson-json"),
        pytest.param('{"a": "9223372036854775808"}', True, id="str-19-digits-json"),
        pytest.param('{"a": "ü"}', False, id="str-orjson"),
    ],
)
def test_which_decoder_decides(document: bytes | str, by_json: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """orjson decodes unless the document has 19 digits in a row or orjson refuses it; json decides those."""
    asked: list[bytes | str] = []
    json_loads = json.loads

    def spy(data: bytes | str) -> Any:
        asked.append(data)
        return json_loads(data)

    monkeypatch.setattr(jsontext.json, "loads", spy)
    same(jsontext.loads(document), json_loads(document))
    assert asked == ([document] if by_json else [])


@pytest.mark.parametrize(
    "document",
    [
        pytest.param('{"a": "\\ud800"}', id="escaped"),
        pytest.param('{"a": "\ud800", "n": 1}', id="raw-lone-surrogate-in-str"),
        pytest.param('{"a": "\udc00 12345678901234567890"}', id="raw-and-digits"),
    ],
)
def test_str_documents_with_lone_surrogates_decode_as_json_does(document: str) -> None:
    """json takes a str holding a lone surrogate (no UTF-8 can); the digit scan must not fail on it."""
    same(jsontext.loads(document), json.loads(document))


def outcome(decode: Any, document: bytes | str) -> tuple[str, str]:
    try:
        return "value", repr(decode(document))
    except ValueError as exc:
        return type(exc).__name__, str(exc)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats() | st.text()
    | st.integers(min_value=-(2**70), max_value=2**70) | st.sampled_from([2**63, -(2**63) - 1, 2**64, 2**64 - 1]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@st.composite
def documents(draw: st.DrawFn) -> bytes | str:
    """JSON text as Python writes it (NaN and lone surrogates included), sometimes damaged, as bytes or str."""
    text = json.dumps(draw(JSON_VALUES), ensure_ascii=draw(st.booleans()))
    if draw(st.booleans()):  # a cut, a stray byte or a lost one
        at = draw(st.integers(min_value=0, max_value=len(text)))
        text = draw(st.sampled_from([text[:at], text[:at] + draw(st.text(max_size=2)) + text[at:],
                                     text[:at] + text[at + 1:]]))
    if draw(st.booleans()):
        return text
    return text.encode("utf-8", "surrogatepass")  # lone surrogates become invalid UTF-8


@hypothesis_settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(document=documents())
def test_random_documents_decode_or_fail_as_json_does(document: bytes | str) -> None:
    assert outcome(jsontext.loads, document) == outcome(json.loads, document)
