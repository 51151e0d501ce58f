"""CPU to decode watch events: the standard library's json (before) against `common.jsontext` (orjson where it
gives the same objects, json otherwise), per 10,000 events.

    python benchmarks/watch_decode.py [--events 10000] [--repeats 15] [--quick] [--out FILE]

The events are the lines kube-apiserver 1.37 wrote for one pod's life and for a kwok GPU node
(tests/fixtures/watch/: ADDED, MODIFIED x3 and DELETED of a 2-GPU pod, 3.2-4.7 kB each; the node's ADDED,
5.2 kB), each copy under its own name and resourceVersion, byte for byte otherwise. The recorded pod carries a
test annotation with a 19-digit number (a string); it is taken out here, since it sends a line to json on purpose.
Rows:
  * json.loads             — what `kube.watch` decoded with before;
  * jsontext.loads         — what it decodes with now;
  * kube._event            — the whole per-line step the feeder sees (decode and shape checks);
  * orjson.loads           — orjson alone, for reference (not used alone: it turns integers beyond 64 bits
                             into floats);
  * jsontext, long digits  — the same events each with a 20-digit integer: every one goes to json (worst case).
CPU seconds are `time.process_time()` over each pass of all events, the median of --repeats passes, scaled to
10,000 events. Prints a table and the load average beside it; writes JSON to --out. Numbers, never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

import orjson  # noqa: E402

from common import jsontext, kube  # noqa: E402

WATCH = ROOT / "tests" / "fixtures" / "watch"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "watch_decode.json"
PER = 10_000  # events the CPU is reported for
TEST_ANNOTATION = (b'"big":"9223372036854775808",', b'\\"big\\":\\"9223372036854775808\\",')


def recorded(name: str) -> list[bytes]:
    """The recorded lines that carry an object with a name (no BOOKMARK), without the test annotation."""
    lines = []
    for line in (WATCH / name).read_bytes().splitlines():
        for cut in TEST_ANNOTATION:
            line = line.replace(cut, b"")
        if line.strip() and json.loads(line)["type"] != "BOOKMARK":
            lines.append(line)
    return lines


def events(shapes: Sequence[bytes], count: int, *, name: bytes, long_digits: bool = False) -> list[bytes]:
    """`count` lines cycling through `shapes`, the i-th renamed `name`-i at resourceVersion 1000000+i."""
    out = []
    for i in range(count):
        shape = shapes[i % len(shapes)]
        meta = json.loads(shape)["object"]["metadata"]
        line = shape.replace(meta["name"].encode(), name + b"-%d" % i)
        line = line.replace(b'"resourceVersion":"%s"' % meta["resourceVersion"].encode(),
                            b'"resourceVersion":"%d"' % (1_000_000 + i))
        if long_digits:
            line = line[:-2] + b',"restartBudget":18446744073709551616}}'  # the object's last key: an extra one
        out.append(line)
    return out


def cpu_per(decode: Callable[[bytes], Any], lines: Sequence[bytes], *, repeats: int) -> dict[str, float]:
    passes = []
    for _ in range(repeats):
        started = time.process_time()
        for line in lines:
            decode(line)
        passes.append(time.process_time() - started)
    scale = PER / len(lines)
    return {"cpu_seconds_per_10k": statistics.median(passes) * scale, "min": min(passes) * scale,
            "max": max(passes) * scale}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=PER, help="events per pass (default 10,000)")
    parser.add_argument("--repeats", type=int, default=15, help="passes per row; the median is reported")
    parser.add_argument("--quick", action="store_true", help="CI: 3 passes")
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 3
    pods, nodes = recorded("pods.jsonl"), recorded("nodes.jsonl")
    sets = {
        "pod": events(pods, args.events, name=b"train"),
        "node": events(nodes, args.events, name=b"kwok-8g2d"),
        "pod, long digits": events(pods, args.events, name=b"train", long_digits=True),
    }
    for lines in sets.values():  # the benchmark measures what the tests prove: the same objects
        assert all(repr(jsontext.loads(line)) == repr(json.loads(line)) for line in lines[: len(pods)])
    rows = [("pod", "json.loads"), ("pod", "jsontext.loads"), ("pod", "kube._event"), ("pod", "orjson.loads"),
            ("node", "json.loads"), ("node", "jsontext.loads"),
            ("pod, long digits", "json.loads"), ("pod, long digits", "jsontext.loads")]
    decoders: dict[str, Callable[[bytes], Any]] = {"json.loads": json.loads, "jsontext.loads": jsontext.loads,
                                                   "kube._event": kube._event, "orjson.loads": orjson.loads}
    load_before = os.getloadavg()
    results: list[dict[str, Any]] = []
    for kind, decoder in rows:
        lines = sets[kind]
        measured = cpu_per(decoders[decoder], lines, repeats=args.repeats)
        results.append({"events": kind, "decoder": decoder, "mean_bytes": sum(map(len, lines)) / len(lines),
                        **measured})
    load_after = os.getloadavg()
    print(f"{'events':<18}{'decoder':<16}{'bytes':>7}{'CPU s / 10k':>13}{'vs json':>9}")
    for row in results:
        base = next(r for r in results if r["events"] == row["events"] and r["decoder"] == "json.loads")
        print(f"{row['events']:<18}{row['decoder']:<16}{row['mean_bytes']:>7.0f}{row['cpu_seconds_per_10k']:>13.3f}"
              f"{base['cpu_seconds_per_10k'] / row['cpu_seconds_per_10k']:>8.2f}x")
    print(f"median of {args.repeats} passes of {args.events} events; load average "
          f"{' '.join(f'{x:.2f}' for x in load_before)} before, {' '.join(f'{x:.2f}' for x in load_after)} after")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": " ".join(["python", "benchmarks/watch_decode.py", *(argv if argv is not None else sys.argv[1:])]),
        "python": platform.python_version(), "orjson": orjson.__version__, "events": args.events,
        "repeats": args.repeats, "rows": results,
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
    }, indent=2))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
