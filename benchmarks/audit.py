"""`prb audit` at benchmark scale: wall time, peak memory and time per step.

Data is SYNTHETIC, not model output: pairs in the reference schema whose answers have
about 60 words (45-75) drawn from 4,000 made-up words with a Zipf-like frequency (exponent
1.1), cut into sentences of 6-14 words; questions of 10-18 words; 3 categories; one user
per 2.5 pairs on average (a user's pairs share their profile of 5 posts); 3 rubric aspects
of 5-9 words per pair. About 1% of the pairs carry a planted defect (an empty, refused,
meta-text, truncated, over-long or rubric-echoing answer) so that the checks have
something to report.

The audit runs in a fresh subprocess on a JSONL file written beforehand (reading is part
of what is timed), the way `prb audit FILE` runs it. The child reports the wall seconds of
``audit()``, the whole process's peak RSS (``ru_maxrss``, nothing subtracted: it includes
the interpreter and the imported libraries) and the seconds of each step. Targets from
the issue: 100,000 pairs in under 60 s and 2 GB peak.

Writes benchmarks/results/audit.json and prints a short table::

    .venv/bin/python benchmarks/audit.py [--n 100000] [--out PATH] [--seed 0]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "audit.json"
TARGET_SECONDS = 60.0
TARGET_PEAK_MB = 2048.0
VOCAB = 4000
ZIPF_EXPONENT = 1.1
DEFECT_SHARE = 0.01
CATEGORIES = ("Art_and_Entertainment", "Lifestyle_and_Personal_Development", "Society_and_Culture")
DEFECTS = ("empty", "refusal", "meta_text", "truncated_text", "over_cap", "rubric_echo")


def vocabulary(rng: np.random.Generator, size: int = VOCAB) -> list[str]:
    onsets = ["", "b", "br", "c", "d", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "pl", "r"]
    onsets += ["s", "st", "t", "tr", "v", "w", "z", "sh", "ch", "th"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"]
    words: dict[str, None] = {}
    while len(words) < size:
        syl = int(rng.integers(1, 5))
        w = "".join(
            onsets[rng.integers(len(onsets))]
            + vowels[rng.integers(len(vowels))]
            + codas[rng.integers(len(codas))]
            for _ in range(syl)
        )
        if len(w) >= 2:
            words[w] = None
    return list(words)


class Text:
    """Zipf-like word draws, rendered as sentences with capitals and full stops."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.vocab = vocabulary(rng)
        p = 1.0 / np.arange(1, len(self.vocab) + 1) ** ZIPF_EXPONENT
        self.p = p / p.sum()
        # draw word indices in large blocks: one rng call per block, not per word
        self._buf = np.empty(0, dtype=np.int64)

    def _take(self, n: int) -> list[str]:
        if self._buf.size < n:
            self._buf = self.rng.choice(len(self.vocab), size=1_000_000, p=self.p)
        out, self._buf = self._buf[:n], self._buf[n:]
        return [self.vocab[k] for k in out.tolist()]

    def sentences(self, n_words: int) -> str:
        ws = self._take(n_words)
        out, i = [], 0
        while i < n_words:
            k = int(self.rng.integers(6, 15))
            chunk = ws[i : i + k]
            out.append(" ".join([chunk[0].capitalize(), *chunk[1:]]) + ".")
            i += k
        return " ".join(out)

    def question(self) -> str:
        ws = self._take(int(self.rng.integers(10, 19)))
        return " ".join(["How", *ws]) + "?"


def make_rows(n: int, seed: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    rng = np.random.default_rng(seed)
    t = Text(rng)
    n_users = max(1, int(n / 2.5))
    profiles: dict[int, list[dict[str, str]]] = {}
    planted: dict[str, int] = {d: 0 for d in DEFECTS}
    rows = []
    for i in range(n):
        u = int(rng.integers(n_users))
        if u not in profiles:
            profiles[u] = [
                {"id": f"u{u}-p{k}", "category": CATEGORIES[k % 3], "text": t.sentences(15)}
                for k in range(5)
            ]
        aspects = [
            {"aspect": t.sentences(int(rng.integers(5, 10)))[:-1], "evidence": "e", "reason": "r"}
            for _ in range(3)
        ]
        chosen = t.sentences(int(rng.integers(45, 76)))
        rejected = t.sentences(int(rng.integers(45, 76)))
        if rng.random() < DEFECT_SHARE:
            kind = DEFECTS[int(rng.integers(len(DEFECTS)))]
            planted[kind] += 1
            if kind == "empty":
                rejected = "   "
            elif kind == "refusal":
                rejected = "I'm sorry, but I can't help with that request."
            elif kind == "meta_text":
                chosen += " This answer covers all the points you listed."
            elif kind == "truncated_text":
                rejected = rejected[:-1] + " and the"
            elif kind == "over_cap":
                chosen += " " + t.sentences(80)
            else:
                chosen += " " + aspects[0]["aspect"] + "."
        rows.append(
            {
                "id": f"syn-{i:07d}",
                "question": t.question(),
                "profile": profiles[u],
                "rubric_aspects": aspects,
                "narrative": "synthetic",
                "category": CATEGORIES[i % 3],
                "chosen": chosen,
                "rejected": rejected,
                "user_id": f"user-{u}",
            }
        )
    return rows, planted


CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[3])
from pipeline.audit import audit
timings = {}
t0 = time.perf_counter()
fig = audit(sys.argv[1], sys.argv[2], timings=timings)
wall = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({
    "seconds": round(wall, 2),
    "peak_rss_mb": round(peak, 1),
    "timings": timings,
    "pairs_flagged": fig["checks"]["pairs_flagged"],
    "counts": fig["checks"]["counts"],
    "probe_auc": fig["shortcut_probe"].get("auc"),
}))
"""


def run(n: int, seed: int, workdir: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    rows, planted = make_rows(n, seed)
    src = workdir / f"pairs-{n}.jsonl"
    with open(src, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    del rows
    gen_s = time.perf_counter() - t0
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(src), str(workdir / f"report-{n}"), str(ROOT)],
        capture_output=True,
        text=True,
        check=True,
    )
    child = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "n": n,
        "input_mb": round(src.stat().st_size / 2**20, 1),
        "generate_s": round(gen_s, 1),
        "planted": planted,
        **child,
        "within_target": child["seconds"] < TARGET_SECONDS
        and child["peak_rss_mb"] < TARGET_PEAK_MB,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    from _smoke import add_flag as add_smoke_flag
    from _smoke import apply as apply_smoke

    add_smoke_flag(ap)
    args = ap.parse_args()
    apply_smoke(args, n=300)
    with tempfile.TemporaryDirectory() as tmp:
        res = run(args.n, args.seed, Path(tmp))
    import numpy
    import rapidfuzz

    result = {
        "benchmark": "audit",
        "smoke": args.smoke,
        "command": " ".join([".venv/bin/python", "benchmarks/audit.py", *sys.argv[1:]]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "libraries": {
            "numpy": numpy.__version__,
            "rapidfuzz": rapidfuzz.__version__,
        },
        "targets": {"seconds": TARGET_SECONDS, "peak_rss_mb": TARGET_PEAK_MB},
        "data": "synthetic (see the script's docstring)",
        "result": res,
        "parent_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    r = res
    print(f"n={r['n']:,}  {r['seconds']} s  peak {r['peak_rss_mb']} MB  (target < 60 s, < 2048 MB)")
    for k, v in r["timings"].items():
        print(f"  {k:22s} {v}")
    print(f"flagged pairs: {r['pairs_flagged']:,}; planted defects: {sum(r['planted'].values())}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
