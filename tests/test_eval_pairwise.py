"""prb eval with LLM judges against the test suite's stand-in OpenAI server, which plays a
judge through this file's own responder (so it does not depend on the stand-in's model)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from eval_split import (
    EVIDENCE_CANARY,
    NARRATIVE_CANARY,
    PROFILE_CANARY,
    PROVENANCE_CANARIES,
    RUBRIC_CANARY,
    crafted_rows,
    write_split,
)
from standin_server import StandinServer

from pipeline.cli import main
from pipeline.eval.pairwise import parse_text_verdict, verdict_schema
from pipeline.types import schemas

ROWS = {r["question"]: (i, r) for i, r in enumerate(crafted_rows())}
_ANSWER = re.compile(r"Answer ([AB]):\n```\n(.*?)\n```", re.S)


def judge(body: dict[str, Any], _: int) -> str:
    """A crafted judge: right on pairs 0-2, always "A" on pair 3, no verdict at all on
    pair 4, the rejected answer on pair 5."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    question = re.search(r"Question:\n```\n(.*?)\n```", user, re.S).group(1)
    i, row = ROWS[question]
    shown = dict(_ANSWER.findall(user))
    chosen_letter = "A" if shown["A"] == row["chosen"] else "B"
    other = "B" if chosen_letter == "A" else "A"
    letter = {3: "A", 5: other}.get(i, chosen_letter)
    as_json = "response_format" in body
    if i == 4:
        return "I would rather not pick one." if not as_json else '{"thoughts": "hmm"}'
    if as_json:
        return json.dumps({"rationale": "fits the person better", "winner": letter})
    return f"**Reasoning:** fits the person better\n**Result:** {letter}"


@pytest.fixture
def judge_server():
    with StandinServer(responder=judge) as s:
        yield s


def _args(split: Path, server: StandinServer, *extra: str) -> list[str]:
    return [
        "eval",
        str(split),
        "--no-progress",
        "--set",
        f"backend.openai.base_url={server.base_url}",
        "--set",
        "backend.openai.max_concurrency=4",
        "--set",
        "backend.openai.timeout_s=120",  # generous: a busy machine must not time a request out
        "--set",
        "backend.backoff_initial_s=0.01",
        *extra,
    ]


def _results(root: Path, slug: str, setting: str) -> dict[str, Any]:
    """One scorer's results on one setting (each setting has its own file)."""
    return json.loads((root / slug / setting / "results.json").read_text())


def test_judge_both_orders_failures_and_a_free_rerun(
    judge_server: StandinServer, tmp_path: Path
) -> None:
    split = write_split(tmp_path)
    args = _args(split, judge_server, "--scorer", "judge:standin-model")
    assert main(args) == 0
    # 6 pairs x 2 orders x 2 settings, plus 2 re-asks per order of pair 4
    assert judge_server.request_count == 2 * (12 + 4)
    root = tmp_path / "split-eval"
    res = {s: _results(root, "judge-standin-model", s) for s in ("question", "profile")}
    for setting in ("question", "profile"):
        assert list(res[setting]["settings"]) == [setting]
        m = res[setting]["settings"][setting]["metrics"]
        assert (m["wins"], m["losses"], m["ties"], m["failed"]) == (3, 1, 1, 1)
        assert m["accuracy"] == 0.6  # 3 of the 5 pairs with a verdict
        assert m["unparsed_verdicts"] == 2 and m["failed_requests"] == 0
        pos = m["position"]
        assert pos["consistency"] == 0.8  # pairs 0, 1, 2, 5 of the 5 parsed
        assert pos["accuracy_chosen_first"] == 0.8
        assert pos["accuracy_chosen_second"] == 0.6
        assert pos["bias"] == 0.2
    assert res["profile"]["profile_gain"]["gain"] == 0.0  # kept with the profile results
    assert res["question"]["profile_gain"] is None
    assert res["question"]["scorer"]["requests"]["question"]["sent"] == 16
    files = [root / "judge-standin-model" / s / "scores.jsonl" for s in ("question", "profile")]
    scores = [json.loads(x) for f in files for x in f.read_text().splitlines()]
    failed = [s for s in scores if s["pair"] == "pair-4"]
    assert all(s["outcome"] is None and set(s["failures"]) == {"AB", "BA"} for s in failed)
    assert all("invalid_json" in r for s in failed for r in s["failures"].values())
    assert all(s["verdicts"] == {"AB": None, "BA": None} for s in failed)  # never "A"

    # A re-run sends nothing: every answer, bad ones included, comes from the cache.
    judge_server.reset()
    assert main(args) == 0
    assert judge_server.request_count == 0
    for setting in ("question", "profile"):
        again = _results(root, "judge-standin-model", setting)
        assert again["settings"] == res[setting]["settings"]


def test_request_schema_pins_the_verdict_and_is_checked_with_its_bound(
    judge_server: StandinServer, tmp_path: Path
) -> None:
    split = write_split(tmp_path)
    assert main(_args(split, judge_server, "--scorer", "judge:", "--setting", "question",
                      "--limit", "2")) == 0  # fmt: skip
    bodies = [r["body"] for r in judge_server.requests]
    assert len(bodies) == 4 and all(b["model"] == "stand-in" for b in bodies)  # backend.model
    schema = bodies[0]["response_format"]["json_schema"]["schema"]
    assert list(schema["properties"]) == ["winner", "rationale"]  # the decision first
    assert schema["properties"]["winner"]["enum"] == ["A", "B"]
    # sent without the rationale's bound (schemas.wire); answers are checked with it
    assert "maxLength" not in schema["properties"]["rationale"]
    assert schema == schemas.wire(verdict_schema(512, ties=False))
    assert verdict_schema(512, ties=False)["properties"]["rationale"]["maxLength"] <= 300
    assert schema["additionalProperties"] is False
    assert all(b["temperature"] == 0.0 for b in bodies)


def test_no_answer_key_in_judge_requests(judge_server: StandinServer, tmp_path: Path) -> None:
    split = write_split(tmp_path)
    settings = ["--setting", "question", "--setting", "profile", "--setting", "rubric"]
    assert main(_args(split, judge_server, "--scorer", "judge:standin-model", *settings)) == 0
    bodies = [json.dumps(r["body"]) for r in judge_server.requests]
    assert len(bodies) == 3 * 16
    rubric_bodies = [b for b in bodies if "What this person expects in an answer" in b]
    profile_bodies = [b for b in bodies if "earlier posts by the person" in b]
    assert len(rubric_bodies) == len(profile_bodies) == 16
    for body in bodies:
        for canary in (EVIDENCE_CANARY, NARRATIVE_CANARY, *PROVENANCE_CANARIES):
            assert canary not in body, f"{canary} leaked into a judge request"
        assert (RUBRIC_CANARY in body) == (body in rubric_bodies)
        assert (PROFILE_CANARY in body) == (body in profile_bodies)
    res = _results(tmp_path / "split-eval", "judge-standin-model", "rubric")
    assert res["settings"]["rubric"]["role"] == "control"
    assert "validity check" in res["settings"]["rubric"]["label"]


def test_text_format_parses_result_lines_and_never_defaults_to_a(
    judge_server: StandinServer, tmp_path: Path
) -> None:
    split = write_split(tmp_path)
    spec = "judge:standin-model,format=text"
    assert main(_args(split, judge_server, "--scorer", spec, "--setting", "question")) == 0
    assert judge_server.request_count == 12  # no re-ask in the free-text format
    assert "response_format" not in judge_server.requests[0]["body"]
    assert "Result: <A or B>" in judge_server.requests[0]["body"]["messages"][-1]["content"]
    res = _results(tmp_path / "split-eval", "judge-standin-model-format=text", "question")
    m = res["settings"]["question"]["metrics"]
    assert (m["wins"], m["losses"], m["ties"], m["failed"]) == (3, 1, 1, 1)
    assert m["unparsed_verdicts"] == 2
    assert res["scorer"]["parse"] == "last 'Result:' line"
    # a free-text answer without a verdict is named for what it is, not "invalid_json"
    file = tmp_path / "split-eval" / "judge-standin-model-format=text" / "question" / "scores.jsonl"
    rows = [json.loads(x) for x in file.read_text().splitlines()]
    (failed,) = [r for r in rows if r["pair"] == "pair-4"]
    reasons = list(failed["failures"].values())
    assert len(reasons) == 2 and all(r.startswith("no_verdict: no 'Result: A'") for r in reasons)
    assert not any("invalid_json" in r for r in reasons)
    # by.category carries the position figures, each category's draw seeded afresh
    for cat in ("Art", "Life"):
        pos = m["by"]["category"][cat]["position"]
        assert pos["reference_order_seed"] == 42 and pos["pairs_both_orders"] >= 2
    assert m["position"]["reference_order_seeded_per"] == "category"


def test_failed_requests_make_the_run_incomplete_then_retry(
    judge_server: StandinServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    split = write_split(tmp_path)
    judge_server.inject("400", count=2, match=lambda b: "sourdough" in json.dumps(b))
    args = _args(split, judge_server, "--scorer", "judge:standin-model", "--setting", "question")
    assert main(args) == 1
    assert "2 judge requests failed" in capsys.readouterr().err
    res = _results(tmp_path / "split-eval", "judge-standin-model", "question")
    assert res["incomplete"] is True
    assert res["settings"]["question"]["metrics"]["failed"] == 2  # pairs 3 and 4
    judge_server.reset()
    assert main(args) == 0
    assert judge_server.request_count == 2  # only the two failed requests are sent again
    res = _results(tmp_path / "split-eval", "judge-standin-model", "question")
    assert res["incomplete"] is False
    assert res["settings"]["question"]["metrics"]["failed"] == 1


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("Reasoning: x\nResult: A", "A"),
        ("**Reasoning:** x\n**Result:** B", "B"),
        ('<think>Result: A</think>\nResult: "B"', "B"),
        ("result: a. Actually, Result: B", "B"),
    ],
)
def test_parse_text_verdict(text: str, letter: str) -> None:
    assert parse_text_verdict(text, ties=False) == letter


@pytest.mark.parametrize(
    ("text", "first", "last"),
    [
        ("Result: A\nOn reflection, Result: B", "A", "B"),
        ("**Result:** B then result: a", "B", "A"),
        ("Result: maybe A\nResult: B", None, "B"),  # the reference's first has no letter
        ("<think>Result: A</think>Reasoning: x\nResult: B", "B", "B"),
    ],
)
def test_parse_first_or_last_result(text: str, first: str | None, last: str) -> None:
    assert parse_text_verdict(text, ties=False, which="last") == last
    if first is None:
        with pytest.raises(ValueError, match="first"):
            parse_text_verdict(text, ties=False, which="first")
    else:
        assert parse_text_verdict(text, ties=False, which="first") == first


@pytest.mark.parametrize("text", ["I prefer A", "Result: C", "Result: tie", "<think>Result: A"])
def test_parse_text_verdict_failures(text: str) -> None:
    with pytest.raises(ValueError):
        parse_text_verdict(text, ties=False)
    assert parse_text_verdict("Result: tie", ties=True) == "tie"


def test_ties_only_when_allowed() -> None:
    from pipeline.core.errors import InputError
    from pipeline.eval.pairwise import verdict_schema

    assert verdict_schema(512, ties=False)["properties"]["winner"]["enum"] == ["A", "B"]
    assert verdict_schema(512, ties=True)["properties"]["winner"]["enum"] == ["A", "B", "tie"]
    with pytest.raises(InputError, match="max_tokens"):
        verdict_schema(20, ties=False)  # no room for a useful rationale
