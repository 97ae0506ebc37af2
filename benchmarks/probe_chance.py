"""The shortcut probe's chance level by set size: the figures docs/audit.md quotes.

For each size, `prb audit`'s ``audit()`` runs on a balanced crafted set (the one
tests/test_audit.py builds: SYNTHETIC pairs whose chosen and rejected answers are drawn
from the same length distribution, so any probe figure is chance) and records what 95% of
the side-swapped runs reach (``chance_highest_p95``), the probe's status and the pairs it
says a set needs to clear. The chance level falls towards 0.5 as 1/sqrt(n); where it
crosses the 0.6 threshold is the smallest set the probe can clear.

Writes benchmarks/results/probe_chance.json and prints a table::

    .venv/bin/python benchmarks/probe_chance.py [--sizes 10,40,100,150,300] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT, ROOT / "benchmarks", ROOT / "tests"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import _smoke  # noqa: E402

from pipeline.audit import PROBE_FLAG_AUC, audit  # noqa: E402
from pipeline.core.io import write_json_atomic  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "probe_chance.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,40,100,150,300", help="pairs per set")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    _smoke.apply(args, sizes="10,12")
    from test_audit import crafted, write_jsonl  # the tests' balanced set, not a copy

    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="probe-chance-") as tmp:
        for n in sizes:
            src = write_jsonl(Path(tmp) / f"{n}.jsonl", crafted(n, biased=False))
            probe = audit(src, Path(tmp) / f"out-{n}")["shortcut_probe"]
            rows.append(
                {
                    "pairs": n,
                    "chance_highest_p95": probe.get("chance_highest_p95"),
                    "status": probe["status"],
                    "needs_pairs": probe.get("needs_pairs"),
                }
            )
            print(f"{n:>6} pairs: chance {probe.get('chance_highest_p95')}, {probe['status']}")
    result = {
        "benchmark": "probe_chance",
        "smoke": bool(args.smoke),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/probe_chance.py " + shlex.join(argv or sys.argv[1:]),
        "data": "synthetic balanced sets (tests/test_audit.py crafted(n, biased=False))",
        "threshold": PROBE_FLAG_AUC,
        "sizes": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
