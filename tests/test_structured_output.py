"""What a run sends each engine of a JSON schema, and how it reads what comes back
(docs/structured-output.md): the form follows the backend's identity, a verdict cut short
after its decisions is kept and marked, over-long free text is shortened and recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import write_config

from pipeline.config import load_config
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run import RunDir
from pipeline.types import schemas


def _name(body: dict[str, Any]) -> str | None:
    return ((body.get("response_format") or {}).get("json_schema") or {}).get("name")


def _sent(server: Any) -> list[dict[str, Any]]:
    return [r["body"] for r in server.requests if _name(r["body"])]


def test_the_schema_form_follows_the_backends_identity(tmp_path: Path, server) -> None:
    """By default a server is sent no string bound; with schema_bounds, the full schemas,
    and the run is another backend to the cache (every request asked again)."""
    cfg = write_config(tmp_path, server, rubrics={"source": "generated"})
    run_pipeline(load_config(cfg), until="judge", progress=False)
    first = _sent(server)
    assert first and all(
        schemas.bounded_strings(b["response_format"]["json_schema"]["schema"]) == 0 for b in first
    )
    server.reset()
    run_pipeline(
        load_config(cfg, ["backend.openai.schema_bounds=true"]), until="judge", progress=False
    )
    again = _sent(server)
    assert len(again) == len(first)  # nothing served from the unbounded run's answers
    assert all(
        schemas.bounded_strings(b["response_format"]["json_schema"]["schema"]) > 0 for b in again
    )
    env = json.loads((tmp_path / "outputs" / "t" / "environment.json").read_text())
    assert env["served_by"][schemas.SCHEMA_BOUNDS] is True


def test_a_verdict_cut_after_its_scores_is_kept_and_marked(tmp_path: Path, server) -> None:
    """Three quality verdicts cut at max_tokens in their rationales: kept, marked cut, no
    re-ask; the rationales hold what was written."""
    server.inject("length", 3, match=lambda b: _name(b) == "QualityVerdict")
    cfg = write_config(tmp_path, server)
    stats = run_pipeline(load_config(cfg), until="judge", progress=False)
    rows = list(RunDir(tmp_path / "outputs" / "t").stage("judge").rows())
    verdicts = [v for r in rows for v in r["quality"].values()]
    cut = [v for v in verdicts if v["cut"]]
    assert len(cut) == 3 and all(v["parse_ok"] for v in verdicts)
    for v in cut:
        assert all(v[d] in schemas.SCORES for d in ("correctness", "relevance", "helpfulness"))
        assert "" in v["rationale"].values()  # a rationale the cut never reached
    llm = stats["judge"]["llm"]
    assert llm["reasks"] == 0 and llm["failed"] == 0


def test_over_long_free_text_is_shortened_to_its_bound_and_recorded(tmp_path: Path) -> None:
    from standin_server import StandinServer

    bound = schemas.pairwise_schema(1024)["properties"]["rationale"]["maxLength"]

    def responder(body: dict[str, Any], i: int) -> str | None:
        if _name(body) == "PairwiseVerdict":
            return json.dumps({"winner": "A", "rationale": "because " * bound})
        return None  # the player answers the rest

    with StandinServer(responder=responder) as srv:
        cfg = write_config(tmp_path, srv)
        run_pipeline(load_config(cfg), until="judge", progress=False)
    rows = list(RunDir(tmp_path / "outputs" / "t").stage("judge").rows())
    shown = [v for r in rows for p in r["pairwise"] for k in ("pairwise_aware", "pairwise_blind")
             for v in p.get(k, {}).values()]  # fmt: skip
    assert shown and all(v["clipped"] == ["answer.rationale"] for v in shown)
    assert all(len(v["rationale"]) <= bound and v["rationale"].endswith("because") for v in shown)
