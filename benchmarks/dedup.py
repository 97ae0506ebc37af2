"""Near-duplicate detection (pipeline/rules/dedup.py) at benchmark scale: time, peak memory, recall.

Data is SYNTHETIC, not model output: answers of about 60 words (45-75) drawn from a vocabulary of
4,000 made-up words with a Zipf-like frequency (exponent 1.1, so common words and common
three-word runs recur across answers the way function words do in real text), cut into
sentences of 6-14 words with a capital and a full stop. 1% of the answers are planted
near-duplicates of another answer: 1, 2 or 3 words substituted, or one sentence moved.

Each size runs ``near_duplicate_pairs`` with its defaults (threshold 90) in a fresh subprocess,
so the peak memory of one size is not inherited by the next. The child reports wall seconds of
the call, the whole process's peak RSS (``ru_maxrss``, nothing subtracted; it includes the
generated texts and the interpreter), the RSS just before the call for context, the candidate
and verified pair counts, and the recall of the planted pairs. Targets from the issue: 100,000
answers in <= 60 s and <= 2 GB peak.

Writes benchmarks/results/dedup.json and prints a short table::

    .venv/bin/python benchmarks/dedup.py [--sizes 10000,100000] [--out PATH] [--seed 0]
        [--num-perm 64 --bands 16]
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
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.rules.dedup import near_duplicate_pairs  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "dedup.json"
TARGET_SECONDS = 60.0
TARGET_PEAK_MB = 2048.0
VOCAB = 4000
ZIPF_EXPONENT = 1.1
PLANTED_SHARE = 0.01
EDITS = ("subst1", "subst2", "subst3", "move_sentence")


def vocabulary(rng: np.random.Generator, size: int = VOCAB) -> list[str]:
    """Distinct pronounceable made-up words of 1-4 syllables."""
    onsets = ["", "b", "br", "c", "d", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "pl", "r"]
    onsets += ["s", "st", "t", "tr", "v", "w", "z", "sh", "ch", "th"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"]
    words: dict[str, None] = {}
    while len(words) < size:
        syllables = rng.integers(1, 5)
        word = "".join(
            onsets[rng.integers(len(onsets))]
            + vowels[rng.integers(len(vowels))]
            + codas[rng.integers(len(codas))]
            for _ in range(syllables)
        )
        words[word] = None
    return list(words)


def render(words: list[str], cuts: list[int]) -> str:
    """Words as sentences: ``cuts`` are the sentence lengths."""
    out, pos = [], 0
    for length in cuts:
        sentence = words[pos : pos + length]
        pos += length
        out.append(" ".join([sentence[0].capitalize(), *sentence[1:]]) + ".")
    return " ".join(out)


def sentence_lengths(rng: np.random.Generator, n_words: int) -> list[int]:
    cuts: list[int] = []
    left = n_words
    while left > 0:
        length = min(left, int(rng.integers(6, 15)))
        if 0 < left - length < 4:  # no stub sentence at the end
            length = left
        cuts.append(length)
        left -= length
    return cuts


def synthetic_answers(n: int, seed: int = 0) -> tuple[list[str], list[tuple[int, int, str]]]:
    """``n`` synthetic answers, and the planted pairs ``(original, copy, edit)`` with i < j."""
    rng = np.random.default_rng(seed)
    vocab = vocabulary(rng)
    weights = 1.0 / np.arange(1, VOCAB + 1) ** ZIPF_EXPONENT
    weights /= weights.sum()
    n_planted = int(n * PLANTED_SHARE)
    n_base = n - n_planted
    lengths = rng.integers(45, 76, size=n_base)
    draws = rng.choice(VOCAB, size=int(lengths.sum()), p=weights)
    bases: list[tuple[list[str], list[int]]] = []
    pos = 0
    for length in lengths.tolist():
        words = [vocab[k] for k in draws[pos : pos + length]]
        pos += length
        bases.append((words, sentence_lengths(rng, length)))

    copies: list[tuple[int, str, str]] = []  # (base index, edit, text)
    for b in rng.choice(n_base, size=n_planted, replace=False).tolist():
        words, cuts = bases[b]
        edit = EDITS[int(rng.integers(len(EDITS)))]
        if edit == "move_sentence" and len(cuts) > 1:
            # The first sentence moves to the end.
            first = cuts[0]
            text = render(words[first:] + words[:first], cuts[1:] + cuts[:1])
        else:
            edit = "subst1" if edit == "move_sentence" else edit
            changed = list(words)
            for p in rng.choice(len(words), size=int(edit[-1]), replace=False).tolist():
                while changed[p] == words[p]:
                    changed[p] = vocab[int(rng.choice(VOCAB, p=weights))]
            text = render(changed, cuts)
        copies.append((b, edit, text))

    # Interleave: copies go to random slots so that originals and copies are far apart.
    slots = np.sort(rng.choice(n, size=n_planted, replace=False)).tolist()
    texts: list[str] = []
    where = [0] * n_base
    planted: list[tuple[int, int, str]] = []
    copy_at = dict(zip(slots, copies, strict=True))
    base_iter = iter(range(n_base))
    placed: list[tuple[int, int, str]] = []  # (slot, base, edit)
    for slot in range(n):
        if slot in copy_at:
            b, edit, text = copy_at[slot]
            texts.append(text)
            placed.append((slot, b, edit))
        else:
            b = next(base_iter)
            where[b] = slot
            words, cuts = bases[b]
            texts.append(render(words, cuts))
    for slot, b, edit in placed:
        i, j = sorted((where[b], slot))
        planted.append((i, j, edit))
    return texts, sorted(planted)


def rss_mb() -> float:
    """Current resident set size of this process, MB (Linux /proc; else the peak so far)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(n: int, seed: int, num_perm: int, bands: int) -> dict[str, Any]:
    """One size, in this (fresh) process."""
    texts, planted = synthetic_answers(n, seed)
    baseline = rss_mb()
    stats: dict[str, float] = {}
    t0 = time.perf_counter()
    pairs = near_duplicate_pairs(texts, num_perm=num_perm, bands=bands, stats=stats)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    found = {(i, j) for i, j, _ in pairs}
    planted_set = {(i, j) for i, j, _ in planted}
    by_edit = {
        edit: round(
            sum((i, j) in found for i, j, e in planted if e == edit)
            / max(1, sum(e == edit for *_, e in planted)),
            4,
        )
        for edit in EDITS
    }
    return {
        "n": n,
        "seconds": round(seconds, 3),
        "peak_rss_mb": round(peak, 1),
        "baseline_rss_mb": round(baseline, 1),
        "candidate_pairs": int(stats["candidate_pairs"]),
        "verified_pairs": int(stats["verified_pairs"]),
        "planted_pairs": len(planted),
        "planted_recall": round(len(found & planted_set) / max(1, len(planted_set)), 4),
        "planted_recall_by_edit": by_edit,
        "verified_not_planted": len(found - planted_set),
        "step_seconds": {k[:-2]: round(v, 3) for k, v in stats.items() if k.endswith("_s")},
        "meets_target": seconds <= TARGET_SECONDS and peak <= TARGET_PEAK_MB,
    }


def machine() -> dict[str, Any]:
    import rapidfuzz

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if "model name" in line)
    except (OSError, StopIteration):
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "rapidfuzz": rapidfuzz.__version__,
        # Other work on the machine slows the timings; this says how busy it was.
        "load_average_1_5_15min": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000", help="comma-separated answer counts")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-perm", type=int, default=64)
    ap.add_argument("--bands", type=int, default=16)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    from _smoke import add_flag as add_smoke_flag
    from _smoke import apply as apply_smoke

    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, sizes="300,600")

    if args.child is not None:
        print(json.dumps(child(args.child, args.seed, args.num_perm, args.bands)))
        return

    sizes = [int(s) for s in args.sizes.split(",") if s]
    runs = []
    for n in sizes:
        cmd = [sys.executable, __file__, "--child", str(n), "--seed", str(args.seed)]
        cmd += ["--num-perm", str(args.num_perm), "--bands", str(args.bands)]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        run = json.loads(done.stdout.strip().splitlines()[-1])
        runs.append(run)
        print(
            f"n={n:>7}  {run['seconds']:7.2f} s  peak {run['peak_rss_mb']:7.1f} MB "
            f"(baseline {run['baseline_rss_mb']:.1f})  candidates {run['candidate_pairs']:>7}  "
            f"verified {run['verified_pairs']:>6}  planted recall {run['planted_recall']:.4f}"
        )
    by_n = {r["n"]: r for r in runs}
    growth = None
    if len(runs) > 1:
        small, large = min(by_n), max(by_n)
        growth = {
            "sizes": [small, large],
            "seconds_ratio": round(by_n[large]["seconds"] / by_n[small]["seconds"], 2),
        }
    result = {
        "benchmark": "near-duplicate detection, pipeline.rules.dedup.near_duplicate_pairs",
        "smoke": args.smoke,
        "data": (
            f"synthetic: {VOCAB}-word made-up vocabulary, Zipf exponent {ZIPF_EXPONENT}, "
            f"45-75 words per answer, {PLANTED_SHARE:.0%} planted near-duplicates "
            f"({', '.join(EDITS)}), seed {args.seed}"
        ),
        "params": {"threshold": 90.0, "shingle": 3, "num_perm": args.num_perm, "bands": args.bands},
        "runs": runs,
        "growth": growth,
        "targets": {"n": 100_000, "seconds": TARGET_SECONDS, "peak_rss_mb": TARGET_PEAK_MB},
        "pass": all(r["meets_target"] for r in runs),
        "machine": machine(),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(
            [
                ".venv/bin/python",
                "benchmarks/dedup.py",
                *(argv if argv is not None else sys.argv[1:]),
            ]
        ),
    }
    if growth:
        print(
            f"seconds({growth['sizes'][1]}) / seconds({growth['sizes'][0]}) = "
            f"{growth['seconds_ratio']}"
        )
    print("PASS" if result["pass"] else "FAIL", f"(targets {TARGET_SECONDS:.0f} s, 2 GB)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
