"""Rebuild examples/quickstart/cache.jsonl from the hand-written answers.

Runs configs/quickstart.yaml through the `openai` backend against the test suite's
stand-in server, whose responder answers every prompt from
examples/quickstart/answers.json (answers and verdicts written by hand), then exports the
run's request cache as JSONL. Re-run it whenever a prompt template changes:

    .venv/bin/python scripts/build_quickstart_cache.py
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from standin_server import StandinServer  # noqa: E402

from pipeline.config import load_config  # noqa: E402
from pipeline.core.io import write_jsonl_atomic  # noqa: E402
from pipeline.orchestration.orchestrate import run_pipeline  # noqa: E402

QS = ROOT / "examples" / "quickstart"
DIMS = ("correctness", "relevance", "helpfulness")


def make_responder(answers: dict, questions: dict[str, str]):
    by_text = {
        text: (ex_id, side)
        for ex_id, sides in answers["examples"].items()
        for side, text in sides.items()
    }
    judge = answers["judge"]

    def answered(prompt: str) -> list[tuple[str, str]]:
        return [by_text[t] for t in re.findall(r"<<<\n(.*?)\n>>>", prompt, re.S)]

    def responder(body: dict, i: int) -> str:
        prompt = body["messages"][-1]["content"]
        fmt = (body.get("response_format") or {}).get("json_schema") or {}
        name = fmt.get("name")
        if name is None:
            q = re.search(r"^Question: (.*)$", prompt, re.M).group(1)
            side = "chosen" if "covers every one of these points" in prompt else "rejected"
            return answers["examples"][questions[q]][side]
        if name == "QualityVerdict":
            ex_id, side = answered(prompt)[0]
            scores = judge["quality"][ex_id][side]
            out = dict(zip(DIMS, scores, strict=True))  # scores first, then the rationales
            for d in DIMS:
                out[f"{d}_rationale"] = judge["quality_rationale"][side]
            return json.dumps(out)
        if name == "CoverageVerdict":
            _, side = answered(prompt)[0]
            ids = re.findall(r"^- (P\d+):", prompt, re.M)
            score = 2 if side == "chosen" else 0
            why = judge["coverage_rationale"][side]
            return json.dumps(
                {"scores": {x: score for x in ids}, "rationales": {x: why for x in ids}}
            )
        if name == "PairwiseVerdict":
            (_, side_a), _ = answered(prompt)
            if "expects in an answer" in prompt:
                winner = "A" if side_a == "chosen" else "B"
                why = "The chosen answer covers what this person asked for; the other does not."
            else:
                winner, why = "tie", "Both are accurate and helpful for a general reader."
            return json.dumps({"winner": winner, "rationale": why})
        raise ValueError(f"no hand-written answer for a {name or 'text'} request")

    return responder


def main() -> None:
    answers = json.loads((QS / "answers.json").read_text())
    questions = {
        json.loads(line)["question"]: json.loads(line)["id"]
        for line in (QS / "input.jsonl").read_text().splitlines()
        if line.strip()
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        StandinServer(
            responder=make_responder(answers, questions), responder_name="hand-written"
        ) as server,
    ):
        cfg = load_config(
            ROOT / "configs" / "quickstart.yaml",
            [
                "backend.name=openai",
                f"backend.openai.base_url={server.base_url}",
                "backend.replay.cache=null",
                f"run.output_dir={tmp}",
            ],
        )
        run_pipeline(cfg, progress=False)
        db = sqlite3.connect(Path(tmp) / "quickstart" / "cache.sqlite")
        # what answered: the stand-in with the hand-written responder, recorded with every
        # row so the replay keys its requests by it and the card says no model answered
        identities = {k: json.loads(v) for k, v in db.execute("SELECT id, identity FROM backends")}
        rows = [
            {
                "key": k,
                "stage": st,
                "request": json.loads(rq),
                "response": json.loads(rs),
                "served_by": {
                    key: value
                    for key, value in identities[json.loads(rq)["served_by"]].items()
                    if key != "asked"  # the build's own port: not part of what answered
                },
                "_note": "hand-written answer (examples/quickstart/answers.json)",
            }
            for k, st, rq, rs in db.execute(
                "SELECT key, stage, request, response FROM responses ORDER BY stage, key"
            )
        ]
        db.close()
    n = write_jsonl_atomic(QS / "cache.jsonl", rows)
    print(f"wrote {n} hand-written answers to {QS / 'cache.jsonl'}")


if __name__ == "__main__":
    main()
