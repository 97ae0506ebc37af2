"""Pointwise reward-model scoring in prb eval: batched and length-sorted against a loop that
scores one input at a time, on the same pairs, model and device.

Data is SYNTHETIC, not LaMP-QA: questions of 12-20 words, answers of 70-100 words and 10
profile posts of 20-40 words per user, drawn from a made-up vocabulary with the script's
seed. The model is, by default, the tiny random Llama classifier of
``pipeline/eval/tiny.py`` built in a temporary folder (its scores are noise: this measures
the machinery); ``--model PATH`` takes any local sequence-classification model folder
instead, and the script runs unchanged on a GPU (bf16 there, float32 on the CPU, as
``prb eval`` does).

Both paths include tokenisation and run through ``pipeline.eval.pointwise``: the batched
path is what ``prb eval`` does (encode everything, then ``score_ids`` in length-sorted
batches of ``--batch-size``); the loop encodes and scores each input alone (batch 1, no
padding). The two run alternately ``--repeats`` times after a warm-up, best time kept. The
figure is pairs per second (a pair is two inputs: chosen and rejected), per setting.

    .venv/bin/python benchmarks/eval_pointwise.py [--model PATH] [--pairs 64]
        [--batch-size 16] [--repeats 5] [--out benchmarks/results/eval_pointwise.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline.eval.data import build_pairs, user_turn  # noqa: E402
from pipeline.eval.pointwise import Encoder, TransformersScorer  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "eval_pointwise.json"


def synthetic_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """SYNTHETIC pairs in the reference schema, from made-up words."""
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ne", "su", "ra", "to", "vi", "de", "po", "ga", "li", "mo", "ze"]
    vocab = sorted(
        {"".join(rng.choice(syll) for _ in range(rng.randint(1, 3))) for _ in range(3000)}
    )

    def text(lo: int, hi: int) -> str:
        words = [rng.choice(vocab) for _ in range(rng.randint(lo, hi))]
        return " ".join(words).capitalize() + "."

    rows = []
    for i in range(n):
        rows.append(
            {
                "id": f"synthetic-{i}",
                "question": text(12, 20)[:-1] + "?",
                "profile": [
                    {"id": f"s{i}-{k}", "category": "x", "text": text(20, 40)} for k in range(10)
                ],
                "chosen": text(70, 100),
                "rejected": text(70, 100),
                "category": "synthetic",
            }
        )
    return rows


def timed_pair(a: Any, b: Any, repeats: int) -> tuple[float, Any, float, Any]:
    """Best wall time of ``a`` and of ``b``, run alternately (a, b, a, b...) after one
    warm-up of each, so load from other processes on a shared machine hits both alike."""
    a(), b()  # warm-up: first-call allocations and lazy initialisation stay out
    best_a = best_b = float("inf")
    out_a = out_b = None
    for _ in range(repeats):
        start = time.perf_counter()
        out_a = a()
        best_a = min(best_a, time.perf_counter() - start)
        start = time.perf_counter()
        out_b = b()
        best_b = min(best_b, time.perf_counter() - start)
    return best_a, out_a, best_b, out_b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="a local sequence-classification model folder")
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    from _smoke import add_flag as add_smoke_flag
    from _smoke import apply as apply_smoke

    add_smoke_flag(ap)
    args = ap.parse_args()
    apply_smoke(args, pairs=4, repeats=1, batch_size=4)

    import torch

    load_before = os.getloadavg()[0]
    rows = synthetic_rows(args.pairs, args.seed)
    pairs = build_pairs(rows, "synthetic", top_k=10)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            from pipeline.eval.tiny import build_tiny_reward_model

            texts = [t for r in rows for t in (r["question"], r["chosen"], r["rejected"])]
            texts += [p["text"] for r in rows for p in r["profile"]]
            model_path = build_tiny_reward_model(Path(tmp) / "tiny-rm", texts)
            model_label = "tiny random Llama classifier (pipeline/eval/tiny.py)"
        else:
            model_path, model_label = args.model, str(args.model)
        encoder = Encoder(model_path)
        scorer = TransformersScorer(encoder, batch_size=args.batch_size, progress=False)
        one = TransformersScorer(encoder, batch_size=1, progress=False)
        one.model = scorer.model  # the same weights: only the batching differs
        figures: dict[str, Any] = {}
        for setting in ("question", "profile"):
            convs = []
            for p in pairs:
                u = user_turn(p, setting)
                convs += [(u, p.chosen), (u, p.rejected)]

            def batched(convs: list = convs) -> list[float]:
                return scorer.score_ids(encoder.encode(convs))

            def loop(convs: list = convs) -> list[float]:
                return [one.score_ids(encoder.encode([c]))[0] for c in convs]

            t_batch, s_batch, t_loop, s_loop = timed_pair(batched, loop, args.repeats)
            lengths = [len(x) for x in encoder.encode(convs)]
            figures[setting] = {
                "inputs": len(convs),
                "mean_tokens": round(sum(lengths) / len(lengths), 1),
                "max_tokens": max(lengths),
                "batched_s": round(t_batch, 4),
                "loop_s": round(t_loop, 4),
                "batched_pairs_per_s": round(args.pairs / t_batch, 2),
                "loop_pairs_per_s": round(args.pairs / t_loop, 2),
                "ratio": round(t_loop / t_batch, 2),
                "max_abs_score_diff": max(abs(a - b) for a, b in zip(s_batch, s_loop, strict=True)),
            }
    device = scorer.device
    result = {
        "benchmark": "eval_pointwise",
        "smoke": args.smoke,
        "what": "pairs/s of prb eval's batched, length-sorted pointwise scoring vs one input "
        "at a time, same pairs, model and device (run alternately; best of repeats after a "
        "warm-up)",
        "data": f"SYNTHETIC: {args.pairs} pairs, 70-100-word answers, 10 profile posts each",
        "model": model_label,
        "device": device,
        "device_name": torch.cuda.get_device_name(0) if device.startswith("cuda") else
        platform.processor() or platform.machine(),
        "dtype": scorer.dtype,
        "torch_threads": torch.get_num_threads(),
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "settings": figures,
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'setting':9s} {'tokens':>7s} {'batched p/s':>12s} {'loop p/s':>9s} {'ratio':>6s}")
    for name, f in figures.items():
        print(
            f"{name:9s} {f['mean_tokens']:7.1f} {f['batched_pairs_per_s']:12.2f} "
            f"{f['loop_pairs_per_s']:9.2f} {f['ratio']:6.2f}"
        )
    print(f"device {device} ({scorer.dtype}); written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
