"""The audit as a user meets it: the report page (nothing in a row can break it), two
sources side by side, --fail-on exit codes, a run that was never published, the probe
naming what drives it, and one-line errors for bad input with nothing written."""

from __future__ import annotations

import contextlib
import html.parser
import json
import random
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_audit import crafted, write_jsonl

from pipeline.audit import audit, load_pairs
from pipeline.cli import main
from pipeline.core.errors import InputError
from pipeline.run import RunDir

NASTY = "<!-- x --> <script>alert(1)</script> </script> & \"q\" 'a' </title> ]]>"


def _nasty_rows(n: int = 12) -> list[dict]:
    """Every text field, the category included, carries comment and script markup."""
    rows = crafted(n, biased=False, seed=9)
    for i, r in enumerate(rows):
        r.update(
            id=f"{NASTY} id {i}",
            question=f"{NASTY} question {i}?",
            category=f"{NASTY} cat {i % 2}",
            narrative=NASTY,
            user_id=f"{NASTY} user {i}",
            profile=[{"id": NASTY, "category": NASTY, "text": f"{NASTY} post {i}"}],
            rubric_aspects=[
                {"aspect": NASTY + " aspect text here", "evidence": NASTY, "reason": NASTY}
            ],
        )
        r["chosen"] = f"{NASTY} {r['chosen']}"
        r["rejected"] = f"{r['rejected']} {NASTY} and"  # ends mid-sentence: it gets flagged
    rows[0]["chosen"] = NASTY + " This answer covers all the points you listed."
    return rows


class _Elements(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.starts: list[str] = []
        self.comments: list[str] = []
        self.script_data: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.starts.append(tag)
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_comment(self, data):
        self.comments.append(data)

    def handle_data(self, data):
        if self._in_script:
            self.script_data.append(data)


def test_nothing_in_a_row_breaks_the_page_or_its_data(tmp_path):
    fig = audit(write_jsonl(tmp_path / "nasty.jsonl", _nasty_rows()), tmp_path / "out")
    page = (tmp_path / "out" / "audit.html").read_text(encoding="utf-8")
    parsed = _Elements()
    parsed.feed(page)
    # one script element (ours, the data), no comment, no tag from the data
    assert parsed.starts.count("script") == 1 and parsed.comments == []
    assert "<!--" not in page and "alert(1)</script>" not in page
    assert page.count("</script>") == 1 and NASTY not in page  # never raw
    data = json.loads("".join(parsed.script_data))
    saved = json.loads((tmp_path / "out" / "audit.json").read_text(encoding="utf-8"))
    assert data == saved == json.loads(json.dumps({k: v for k, v in fig.items() if k != "outputs"}))
    # the data carries the markup back intact, as text
    assert any(NASTY in c for c in data["per_category"])
    assert any(NASTY in e["detail"] or NASTY in e["id"] for e in data["checks"]["examples"])
    # the flagged-pairs table shows it escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert fig["checks"]["counts"]["truncated_text"] == 12


def test_report_is_legible(tmp_path):
    rows = crafted(40, biased=True)
    rows[3]["rejected"] = "I'm sorry, but I can't help with that."
    audit(write_jsonl(tmp_path / "p.jsonl", rows), tmp_path / "out")
    page = (tmp_path / "out" / "audit.html").read_text(encoding="utf-8")
    for title in ("words per answer", "word-level similarity (0-100)", "share of pairs"):
        assert title in page  # axis titles
    assert re.search(r">\d+%<", page)  # shares as percentages on an axis
    assert "Flagged pairs" in page and "Refusal" in page and "I&#x27;m sorry" in page
    assert "Single-feature AUC" in page and "length in words" in page  # human labels
    visible = re.sub(r"<script.*?</script>|<[^>]+>", " ", page, flags=re.S)
    for raw in ("share_chosen_longer", "single_feature_auc", "chance_auc_p95", "mean_words"):
        assert raw not in visible
    # histogram ranges fitted to the data: round steps over the middle 90% of the answer
    # lengths; the 8-word refusal falls in an open first bin ("< N") instead of
    # stretching the axis down to zero
    fig = json.loads((tmp_path / "out" / "audit.json").read_text())
    hist = fig["length"]["histogram"]
    edges = hist["edges"]
    assert hist["open_start"] and edges[0] > 8 and f"&lt; {edges[1]:g}" in page
    assert 5 <= len(edges) - 1 <= 16 and edges[0] > 0


def _probe_reason(fig: dict) -> dict:
    """The verdict's reason that comes from the shortcut probe."""
    (reason,) = [r for r in fig["verdict"]["reasons"] if r["gate"] == "shortcut_probe"]
    return reason


def test_probe_names_longer_chosen(tmp_path, capsys):
    src = write_jsonl(tmp_path / "longer.jsonl", crafted(120, biased=True))
    assert main(["audit", str(src), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    fig = json.loads((tmp_path / "out" / "audit.json").read_text())
    drivers = fig["shortcut_probe"]["drivers"]
    assert drivers[0]["feature"] in ("words", "chars") and drivers[0]["auc"] > 0.9
    assert drivers[0]["direction"] == "chosen has more"
    assert "chosen answers are longer" in _probe_reason(fig)["text"]
    assert "chosen answers are longer" in out and "FLAGGED" in out
    page = (tmp_path / "out" / "audit.html").read_text(encoding="utf-8")
    assert "below 0.4): chosen answers are longer" in page


def test_probe_names_bullet_lists(tmp_path):
    rng = random.Random(4)
    rows = crafted(120, biased=False, seed=6)
    for r in rows:
        # same sentences on both sides; only the chosen is a bullet list
        parts = [s.strip() for s in re.split(r"(?<=\.) ", r["chosen"] + " " + r["rejected"])]
        parts = [p for p in parts if p] or ["A plan."]
        k = rng.randint(3, 5)
        chosen = [f"{p}." for p in " ".join(parts).split(" ")[: k * 6 : 6]]
        r["chosen"] = "\n".join(f"- {c.capitalize()}" for c in chosen)
        r["rejected"] = " ".join(c.capitalize() for c in chosen)
    fig = audit(write_jsonl(tmp_path / "bullets.jsonl", rows), tmp_path / "out")
    probe = fig["shortcut_probe"]
    assert probe["flagged"]
    named = {d["feature"] for d in probe["drivers"]}
    assert "list_items" in named
    assert any("use more list items" in d["text"] for d in probe["drivers"])
    assert "use more list items" in _probe_reason(fig)["text"]


def test_small_set_reports_asymmetries_not_a_clear(tmp_path, capsys):
    rows = crafted(4, biased=True)
    assert main(["audit", str(write_jsonl(tmp_path / "t.jsonl", rows))]) == 0
    out = capsys.readouterr().out
    assert "too small to clear of shortcuts: 4 pairs; the probe runs from 10 pairs" in out
    assert "chosen answers are longer (in words) in 4 of 4 pairs" in out
    page = (tmp_path / "t-audit" / "audit.html").read_text(encoding="utf-8")
    assert "No shortcut flagged" not in page and "too small to clear of shortcuts" in page


def test_compare_two_sources(tmp_path, capsys):
    a = write_jsonl(tmp_path / "a.jsonl", crafted(60, biased=True, seed=1))
    rows_b = crafted(50, biased=False, seed=2)
    for r in rows_b[:5]:
        r["rejected"] = ""
    b = write_jsonl(tmp_path / "b.jsonl", rows_b)
    code = main(["audit", str(a), "--compare", str(b), "--out", str(tmp_path / "cmp")])
    assert code == 0
    out = capsys.readouterr().out
    assert f"compared with {b}: 50 pairs, 5 flagged" in out
    fig = json.loads((tmp_path / "cmp" / "audit.json").read_text())
    other = fig["compare"]
    assert fig["n_pairs"] == 60 and other["n_pairs"] == 50
    assert other["checks"]["per_100"]["empty"] == 10.0 and fig["checks"]["per_100"]["empty"] == 0
    assert fig["shortcut_probe"]["flagged"] and not other["shortcut_probe"]["flagged"]
    page = (tmp_path / "cmp" / "audit.html").read_text(encoding="utf-8")
    assert "Side by side" in page and "Empty answer per 100" in page and str(b) in page
    assert (tmp_path / "cmp" / "flags-compare.jsonl").read_text().count('"empty"') == 5


def test_pairs_without_a_category_are_uncategorized_as_in_a_release(tmp_path, capsys):
    """A source whose rows have no category, compared with one that has: the figures,
    the per-category table and the side-by-side view say "uncategorized" (the name
    `prb publish` gives those pairs' folder), never "None"."""
    rows_a = crafted(12, biased=False, seed=1)
    for r in rows_a[:4]:
        r["category"] = None
    a = write_jsonl(tmp_path / "a.jsonl", rows_a)
    rows_b = crafted(12, biased=False, seed=2)
    for r in rows_b:
        r.pop("category")
    b = write_jsonl(tmp_path / "b.jsonl", rows_b)
    assert main(["audit", str(a), "--compare", str(b), "--out", str(tmp_path / "cmp")]) == 0
    fig = json.loads((tmp_path / "cmp" / "audit.json").read_text())
    assert fig["per_category"]["uncategorized"]["pairs"] == 4
    assert list(fig["compare"]["per_category"]) == ["uncategorized"]
    assert fig["compare"]["per_category"]["uncategorized"]["pairs"] == 12
    page = (tmp_path / "cmp" / "audit.html").read_text(encoding="utf-8")
    side = page.split("<h2>Side by side</h2>", 1)[1]
    assert "<td>uncategorized</td>" in side
    assert "<td>None</td>" not in page and "None" not in json.dumps(fig["per_category"])


@pytest.mark.parametrize(
    "fail_on, code",
    [
        (None, 0),  # no gate: exit 0 whatever fired
        ("empty", 3),
        ("refusal", 0),  # did not fire
        ("refusal,empty", 3),
        ("any", 3),
        ("shortcut_probe", 3),  # the probe flags on this length-biased set
    ],
)
def test_fail_on_exit_codes(tmp_path, capsys, fail_on, code):
    probe_case = fail_on == "shortcut_probe"
    rows = crafted(40, biased=probe_case)
    rows[5]["rejected"] = "   "
    src = write_jsonl(tmp_path / "p.jsonl", rows)
    args = ["audit", str(src), "--out", str(tmp_path / "o")]
    assert main(args + (["--fail-on", fail_on] if fail_on else [])) == code
    captured = capsys.readouterr()
    if not probe_case:
        assert "checks fired on 1 of 40 pairs (empty 1;" in captured.out
    if code:
        assert "audit gate failed" in captured.err
        assert ("shortcut probe flagged" in captured.err) == probe_case


def test_fail_on_unknown_check_fails_before_any_work(tmp_path, capsys):
    src = write_jsonl(tmp_path / "p.jsonl", crafted(12, biased=False))
    assert main(["audit", str(src), "--out", str(tmp_path / "o"), "--fail-on", "refusals"]) == 1
    err = capsys.readouterr().err
    assert "unknown check 'refusals'" in err and "Did you mean 'refusal'?" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


def test_word_cap_option(tmp_path):
    rows = crafted(12, biased=False)  # answers of 30-60 words
    src = write_jsonl(tmp_path / "p.jsonl", rows)
    assert audit(src, tmp_path / "o1")["checks"]["counts"]["over_cap"] == 0
    fig = audit(src, tmp_path / "o2", word_cap=30)
    assert fig["checks"]["counts"]["over_cap"] > 0 and fig["checks"]["rules"]["cap"] == 33
    assert "--word-cap" in fig["checks"]["rules"]["from"]


# ---- a run directory that was never published ---------------------------------------------


@pytest.fixture(scope="module")
def unpublished_run(tmp_path_factory) -> Path:
    from conftest import write_config
    from standin_server import StandinServer
    from test_judge_pairs import responder

    from pipeline.config import load_config
    from pipeline.orchestration.orchestrate import run_pipeline

    tmp = tmp_path_factory.mktemp("run")
    with StandinServer(responder=responder) as s:
        run_pipeline(load_config(write_config(tmp, s)), progress=False, echo=lambda m: 0)
    return tmp / "outputs" / "t"


def test_unpublished_run_audits_the_pair_stage(unpublished_run, tmp_path, capsys):
    run = tmp_path / "t"
    shutil.copytree(unpublished_run, run)
    assert not (run / "publish").exists()
    assert main(["audit", str(run)]) == 0
    out = capsys.readouterr().out
    assert "no release (publish/): auditing the pair stage's kept pairs" in out
    fig = json.loads((run / "report" / "audit.json").read_text())
    shards = sorted((run / "pairs").glob("data-*.jsonl"))
    kept = [json.loads(x) for f in shards for x in f.read_text().splitlines()]
    assert fig["source"]["format"] == "pairs_stage" and fig["n_pairs"] == len(kept)
    # ids are the source rows' ids (the sample's own ids), judge checks ran on the judge dict
    examples = {
        r["example_id"]: r
        for f in sorted((run / "ingest").glob("data-*.jsonl"))
        for r in map(json.loads, f.read_text().splitlines())
    }
    rows, _ = load_pairs(run)
    assert {r["id"] for r in rows} == {examples[p["example_id"]]["source_id"] for p in kept}
    assert "quality_floor" in fig["checks"]["counts"] and "blind_leak" in fig["checks"]["counts"]
    assert fig["coverage_gap"]["mean_gap"] == 2.0
    assert "rubric_echo" in fig["checks"]["counts"]  # aspects came from the rubrics stage
    page = (run / "report" / "audit.html").read_text(encoding="utf-8")
    assert "auditing the pair stage&#x27;s kept pairs" in page


def test_unpublished_run_with_a_bad_judge_dict(unpublished_run, tmp_path, capsys):
    run = tmp_path / "t"
    shutil.copytree(unpublished_run, run)
    shard = sorted((run / "pairs").glob("data-*.jsonl"))[0]
    lines = shard.read_text().splitlines()
    row = json.loads(lines[1])
    row["judge"]["quality"]["chosen"]["correctness"] = "excellent"
    lines[1] = json.dumps(row)
    shard.write_text("\n".join(lines) + "\n")
    # an edited shard no longer matches the stage's manifest: refused, like `prb run` does
    assert main(["audit", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"stage 'pairs' is damaged: {shard}" in err and "--redo pairs" in err
    assert "Traceback" not in err and not (run / "report").exists()
    # the same record with a manifest that matches: the record's field is named
    RunDir(run).stage("pairs").finish(RunDir(run).stage("pairs").stats())
    assert main(["audit", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"{shard}, line 2: 'judge.quality.chosen.correctness' must be a score 1-5" in err
    assert "Traceback" not in err and not (run / "report").exists()


# ---- bad input: one line, nothing written ---------------------------------------------------


def _bad(tmp_path: Path, name: str, mutate) -> Path:
    rows = crafted(12, biased=False)
    mutate(rows)
    return write_jsonl(tmp_path / name, rows)


@pytest.mark.parametrize(
    "mutate, field, expect",
    [
        (lambda r: r[3].update(quality_chosen="high"), "quality_chosen", "an object of scores"),
        (
            lambda r: r[3].update(quality_rejected={"correctness": 9}),
            "quality_rejected.correctness",
            "1-5",
        ),
        (lambda r: r[3].update(pairwise_blind=["chosen"]), "pairwise_blind", "object"),
        (
            lambda r: r[3].update(pairwise_aware={"AB": "A"}),
            "pairwise_aware.AB",
            "chosen / rejected",
        ),
        (lambda r: r[3].update(coverage_chosen_mean="2"), "coverage_chosen_mean", "number 0-2"),
        (lambda r: r[3].update(human_agreement=True), "human_agreement", "boolean"),
        (lambda r: r[3].update(profile="my posts"), "profile", "list of objects"),
        (lambda r: r[3]["profile"].append(7), "profile[1]", "an object"),
        (
            lambda r: r[3]["rubric_aspects"][0].update(aspect=5),
            "rubric_aspects[0].aspect",
            "string",
        ),
        (lambda r: r[3].update(category=3), "category", "string"),
        (lambda r: r[3].update(id={"x": 1}), "id", "string"),
        (lambda r: r[3].update(chosen=None), "chosen", "null"),
        (lambda r: r[3].update(narrative="\ud800 lone"), "narrative", "surrogate"),
    ],
)
def test_bad_types_are_one_line_errors(tmp_path, capsys, mutate, field, expect):
    src = _bad(tmp_path, "bad.jsonl", mutate)
    with pytest.raises(InputError) as err:
        audit(src, tmp_path / "out")
    assert err.value.field == field and err.value.line == 4 and expect in str(err.value)
    assert not (tmp_path / "out").exists()
    assert main(["audit", str(src), "--out", str(tmp_path / "out")]) == 1
    msg = capsys.readouterr().err
    assert msg.count("\n") == 1 and f"{src}, line 4, field '{field}'" in msg
    assert not (tmp_path / "out").exists()


def test_bad_type_in_parquet_names_the_row(tmp_path):
    rows = crafted(12, biased=False)
    for r in rows:
        r["category"] = 1
    src = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    with pytest.raises(InputError, match=r"row 0: 'category' must be a string or null, got 1"):
        audit(src, tmp_path / "o")


def test_non_utf8_jsonl(tmp_path, capsys):
    src = tmp_path / "latin1.jsonl"
    good = write_jsonl(tmp_path / "g.jsonl", crafted(12, biased=False)).read_bytes()
    lines = good.splitlines(keepends=True)
    lines[6] = lines[6].replace(b"plan", "plän".encode("latin-1"), 1)
    src.write_bytes(b"".join(lines))
    assert main(["audit", str(src), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert f"{src}, line 7: not UTF-8 (byte 0xe4" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "text, expect",
    [
        ('{"question": "q", "chosen": "a", "rejected": [[[[', "not valid JSON"),
        ("[" * 100_000, "nested too deeply"),  # a JSON array file
        ('{"question": "q", "chosen": "a", "rejected": "b", "id": ' + "9" * 5000 + "}", "digits"),
    ],
)
def test_malformed_json(tmp_path, text, expect):
    src = tmp_path / "bad.jsonl"
    src.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=expect):
        load_pairs(src)


def test_out_is_an_existing_file(tmp_path, capsys):
    src = write_jsonl(tmp_path / "p.jsonl", crafted(12, biased=False))
    target = tmp_path / "report.txt"
    target.write_text("keep me")
    assert main(["audit", str(src), "--out", str(target)]) == 1
    err = capsys.readouterr().err
    assert f"{target}, field '--out': is a file" in err and "Traceback" not in err
    assert target.read_text() == "keep me"


def test_report_files_are_all_or_nothing(tmp_path, monkeypatch):
    """A failure while writing leaves the previous report in place, whole."""
    from pipeline.audit import report

    src = write_jsonl(tmp_path / "p.jsonl", crafted(12, biased=False))
    audit(src, tmp_path / "out")
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    real_replace = report.os.replace
    calls = []

    def flaky(a, b):
        calls.append(b)
        raise OSError(28, "No space left on device", str(b))

    monkeypatch.setattr(report.os, "replace", flaky)
    rows = crafted(12, biased=True)
    with pytest.raises(Exception, match="cannot write the report"):
        audit(write_jsonl(tmp_path / "p.jsonl", rows), tmp_path / "out")
    monkeypatch.setattr(report.os, "replace", real_replace)
    after = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert after == before and calls  # no temporary file left, nothing replaced


def test_rules_come_from_the_config(tmp_path):
    """--config sets the patterns and thresholds; a run's own run.yaml is used for it."""
    import yaml

    rows = crafted(12, biased=False)
    rows[2]["chosen"] = rows[2]["chosen"][:-1] + " and a flamingo."
    src = write_jsonl(tmp_path / "p.jsonl", rows)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "input": {"format": "lamp", "path": "x.jsonl"},
                "pairs": {"meta_patterns": [r"\bflamingo\b"], "length_slack": 0.0},
                "responses": {"word_cap": 50},
            }
        )
    )
    fig = audit(src, tmp_path / "o", config=cfg)
    assert fig["checks"]["counts"]["meta_text"] == 1
    assert fig["checks"]["rules"]["cap"] == 50 and fig["checks"]["rules"]["from"] == str(cfg)
    # counts are pairs: a pair with both answers over the cap counts once
    assert fig["checks"]["counts"]["over_cap"] == sum(
        any(len(re.findall(r"[\w']+", r[s])) > 50 for s in ("chosen", "rejected")) for r in rows
    )


def test_a_runs_own_config_is_used(unpublished_run, tmp_path):
    run = tmp_path / "t"
    shutil.copytree(unpublished_run, run)
    fig = audit(run)
    assert fig["checks"]["rules"]["from"] == str(run / "run.yaml")


def test_fuzzed_rows_give_an_audit_or_one_input_error(tmp_path_factory):
    """Any JSON value in any column the audit reads: a report, or an InputError; never
    another exception."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from pipeline.core.errors import PipelineError

    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    values = st.recursive(
        scalars,
        lambda kids: (
            st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=12), kids, max_size=3)
        ),
        max_leaves=8,
    )
    columns = [
        "id", "question", "chosen", "rejected", "category", "profile", "rubric_aspects",
        "user_id", "narrative", "quality_chosen", "quality_rejected", "coverage_chosen_mean",
        "coverage_rejected_mean", "pairwise_aware", "pairwise_blind", "human_agreement",
        "human_verdict",
    ]  # fmt: skip
    base = crafted(12, biased=False, seed=11)
    tmp = tmp_path_factory.mktemp("fuzz")

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.tuples(st.integers(0, 11), st.sampled_from(columns), values), max_size=4))
    def run(changes):
        rows = [dict(r) for r in base]
        for i, col, v in changes:
            rows[i][col] = v
        src = tmp / "f.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        with contextlib.suppress(PipelineError):  # anything else fails the test
            audit(src, tmp / "out")

    run()
