"""What the comparison with the reference's evaluation scripts runs on, shared by the test
(tests/test_eval_reference.py) and by whoever regenerates its figures
(tests/data/reference_eval_figures.json says how): an 80-pair release `prb` publishes from
hand-written sample data, tiny reward models built from its texts, and a fake judge.

The fake judge decides from the question and the two answers it is shown, nothing else, so
our pairwise prompt (``prompts/eval_pairwise.j2``: "Answer A:") and the reference's
(``prompts/pairwise_user.txt``: "Response A:") get the same verdict for the same order.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from conftest import SAMPLE, write_config
from standin_server import StandinServer
from test_judge_pairs import responder

# Every filter but near_duplicate: the variants of one sample question are near duplicates
FILTERS = [
    "judge_parse", "truncated", "empty", "truncated_text", "refusal", "meta_text",
    "rubric_echo", "length", "quality_floor", "quality_gap", "coverage",
    "pairwise_consistency", "similarity",
]  # fmt: skip
VARIANTS = 8  # 12 sample questions x 8 variants: 96 examples, 80 kept pairs


def build_release(tmp: Path) -> Path:
    """A run over 96 examples (the sample input's 12, each in 8 variants) against the
    stand-in server, published with the `filtered` policy; returns the release folder.
    Deterministic: the same bytes on every build."""
    from pipeline.cli import main
    from pipeline.config import load_config
    from pipeline.orchestration.orchestrate import run_pipeline

    tmp.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(x) for x in SAMPLE.read_text(encoding="utf-8").splitlines() if x.strip()]
    out = []
    for k in range(VARIANTS):
        for r in rows:
            q = r["question"] if k == 0 else f"{r['question']} (variant {k})"
            out.append({**r, "id": f"{r['id']}-v{k}", "question": q})
    inp = tmp / "input.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in out), encoding="utf-8")
    with StandinServer(responder=responder) as s:
        cfg = write_config(
            tmp,
            s,
            input={"format": "lamp", "path": str(inp)},
            responses={"n": 2, "strategies": ["avoid_all", "violate_one", "other_user"]},
            pairs={"filters": FILTERS},
        )
        run_pipeline(load_config(cfg), progress=False, echo=lambda m: 0)
    release = tmp / "release"
    args = ["publish", str(tmp / "outputs" / "t"), "--policy", "filtered", "--out", str(release)]
    assert main(args) == 0
    return release


def release_rows(release: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    from pipeline.publish import DATA_FILE

    return pq.read_table(release / "all" / DATA_FILE).to_pylist()


def release_fingerprint(release: Path) -> str:
    """A hash of what both sides score (id, category, question, chosen, rejected, in the
    release's order): the figures are only comparable on the release they came from."""
    import hashlib

    cols = ("id", "category", "question", "chosen", "rejected")
    rows = [[r[c] for c in cols] for r in release_rows(release)]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def build_models(release: Path, folder: Path) -> dict[str, Path]:
    """The tiny reward models of the comparison, vocabularies from the release's questions
    and answers: one logit (``tiny-rm1``), two classes (``tiny-rm2``), and two classes with
    the init's narrow head (``tiny-rm2n``: probabilities near 0.5, which bf16 rounds into
    ties)."""
    from pipeline.eval.tiny import build_tiny_reward_model

    texts = [r[c] for r in release_rows(release) for c in ("question", "chosen", "rejected")]
    return {
        "tiny-rm1": build_tiny_reward_model(folder / "tiny-rm1", texts),
        "tiny-rm2": build_tiny_reward_model(folder / "tiny-rm2", texts, num_labels=2, seed=1),
        "tiny-rm2n": build_tiny_reward_model(
            folder / "tiny-rm2n", texts, num_labels=2, seed=2, head_std=0.02
        ),
    }


def fake_verdict(question: str, a: str, b: str) -> str:
    """The fake judge's answer to one (question, A, B), in the reference's reply format.

    A quarter of the time it says "A" whatever it is shown (a position bias); one time in
    five it prefers the answer not tailored to this question (a mistake); otherwise the one
    tailored to it ("Tailored: for '<question>'"), or it picks by the hash when both or
    neither are. One answer in seven states a verdict, then a second, opposite one: the
    first is its decision (the reference reads the first). One in 31 has no verdict at all
    (the reference reads it as "A"; `prb eval` counts a failure)."""
    h = int(hashlib.sha256(f"{question}\0{a}\0{b}".encode()).hexdigest(), 16)
    if h % 31 == 5:
        return "**Reasoning:** both answers have merits; I cannot decide."
    tailored = [x.startswith(f"Tailored: for '{question}'") for x in (a, b)]
    if h % 4 == 0:
        letter = "A"
    elif tailored[0] != tailored[1]:
        right = "A" if tailored[0] else "B"
        letter = right if h % 5 else ("B" if right == "A" else "A")
    else:
        letter = "AB"[(h >> 8) % 2]
    text = f"**Reasoning:** one answer suits the person better.\n**Result:** {letter}"
    if h % 7 == 3:
        other = "B" if letter == "A" else "A"
        text += f"\nOn reflection, maybe not.\n**Result:** {other}"
    return text


def _fenced(text: str, label: str) -> str:
    m = re.search(rf"{label}:?\n```\n(.*?)\n```", text, re.S)
    assert m, f"no {label!r} block in the judge prompt"
    return m.group(1)


def judge_text(user: str) -> str:
    """The fake judge reading either prompt: ours ("Question:", "Answer A:") or the
    reference's ("User's current question:", "Response A:")."""
    if "Response A:" in user:
        q, a, b = (_fenced(user, x) for x in ("question", "Response A", "Response B"))
    else:
        q, a, b = (_fenced(user, x) for x in ("Question", "Answer A", "Answer B"))
    return fake_verdict(q, a, b)


def judge_responder(body: dict[str, Any], _: int) -> str:
    """The stand-in server's responder playing the fake judge for `prb eval`."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return judge_text(user)
