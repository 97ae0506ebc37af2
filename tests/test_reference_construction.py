"""configs/reference-construction.yaml: the reference's own construction (one answer a side,
written with the user's prompt files, no judge, no filter) on a local stand-in of LaMP-QA's
layout (tests/lamp_repo.py), a tiny encoder for the Contriever ranking and the stand-in
server. Every question of the input is one pair; the requests carry the prompt files' text;
a file without a placeholder its prompt needs is one line before anything runs; the
release's ``profile`` is in the run's ranked order."""

from __future__ import annotations

import copy
import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from lamp_repo import CONFIGS, build_lamp_repo, sample_rows

from pipeline.cli import main
from pipeline.run import RunDir

pytest.importorskip("transformers")  # the contriever extra; CI installs it

ROOT = Path(__file__).resolve().parent.parent
CONSTRUCTION = ROOT / "configs" / "reference-construction.yaml"

# Hand-written test prompts in the reference's placeholder style (not the reference's text).
CHOSEN = """TEST PROMPT (hand-written), chosen side.
Question: {question}
Posts:
{profile}
Cover these: {plan}
"""
REJECTED = """TEST PROMPT (hand-written), rejected side.
Question: {question}
Posts:
{profile}
Leave these out: {plan}
"""


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> str:
    from tiny_encoder import build_tiny_encoder

    return str(build_tiny_encoder(tmp_path_factory.mktemp("tiny-bert")))


def _prompts(folder: Path, chosen: str = CHOSEN, rejected: str = REJECTED) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "chosen.txt").write_text(chosen, encoding="utf-8")
    (folder / "rejected.txt").write_text(rejected, encoding="utf-8")
    return folder


def _rows_with_hard_rubrics() -> dict[str, list[dict]]:
    """Each config's test rows, plus, in the first config, a question whose rubric holds one
    aspect and one whose two aspects are near-duplicates: kept as given."""
    by_config: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    for r in sample_rows():
        by_config[r["category"]].append(r)
    base = by_config[CONFIGS[0]][0]
    one = copy.deepcopy(base)
    one["id"] = "extra-one-aspect"
    one["question"] = "Which single film should I watch first to get into Kurosawa?"
    one["rubric_aspects"] = one["rubric_aspects"][:1]
    dup = copy.deepcopy(base)
    dup["id"] = "extra-near-duplicates"
    dup["question"] = "How do I start collecting vinyl records on a small budget?"
    aspect = dict(dup["rubric_aspects"][0])
    dup["rubric_aspects"] = [aspect, {**aspect, "aspect": aspect["aspect"] + "."}]
    by_config[CONFIGS[0]] += [one, dup]
    # what the reference keeps and the project's construction changes (issue 52): no
    # aspect at all, an aspect repeated (the same text up to case and spaces), and spaces
    # at an aspect's ends
    empty = copy.deepcopy(base)
    empty["id"] = "extra-empty-rubric"
    empty["question"] = "Is it worth learning to develop film at home?"
    empty["rubric_aspects"] = []
    repeated = copy.deepcopy(base)
    repeated["id"] = "extra-repeated-aspect"
    repeated["question"] = "Which camera should I buy for street photography?"
    first = dict(repeated["rubric_aspects"][0])
    repeated["rubric_aspects"] = [
        first,
        {**first, "aspect": "  " + first["aspect"].upper().replace(" ", "  ")},
        *repeated["rubric_aspects"][1:],
    ]
    spaced = copy.deepcopy(base)
    spaced["id"] = "extra-spaces-at-the-ends"
    spaced["question"] = "How do I keep a sketchbook habit on a busy week?"
    spaced["rubric_aspects"] = [
        {**a, "aspect": f"  {a['aspect']} \t", "evidence": f" {a.get('evidence') or ''} "}
        for a in spaced["rubric_aspects"]
    ]
    by_config[CONFIGS[1]] += [empty, repeated, spaced]
    return by_config


EDGE_ROWS = ("extra-empty-rubric", "extra-repeated-aspect", "extra-spaces-at-the-ends")


def _args(tmp_path: Path, repo: Path, encoder: str, server, prompts: Path | None) -> list[str]:
    sets = [
        f"input.dataset={repo}",
        f"input.cache_dir={tmp_path / 'datasets-cache'}",
        f"profile.contriever_model={encoder}",
        f"run.output_dir={tmp_path / 'outputs'}",
        f"backend.openai.base_url={server.base_url}",
        "backend.model=standin-model",
        "backend.openai.max_concurrency=8",
    ]
    if prompts is not None:
        sets.append(f"prompts.dir={prompts}")
    return [a for s in sets for a in ("--set", s)]


def test_the_config_is_the_reference_construction():
    cfg = yaml.safe_load(CONSTRUCTION.read_text())
    reference = yaml.safe_load((ROOT / "configs" / "reference.yaml").read_text())
    # the same source as configs/reference.yaml; its rubrics exactly as the input has them
    for section in ("input", "profile"):
        assert cfg[section] == reference[section]
    assert cfg["rubrics"] == {**reference["rubrics"], "given_as_is": True}
    assert cfg["responses"] == {"n": 1, "strategies": ["avoid_all"], "word_cap": 100}
    assert cfg["prompts"] == {
        "dir": None,
        "files": {"chosen": "chosen.txt", "avoid_all": "rejected.txt"},
    }
    assert cfg["judge"] == {"enabled": False}
    assert cfg["pairs"] == {"filters": []}


def test_every_question_is_one_pair_written_with_the_prompt_files(
    tmp_path, server, encoder, capsys
):
    by_config = _rows_with_hard_rubrics()
    repo = build_lamp_repo(tmp_path / "LaMP-QA", by_config)
    prompts = _prompts(tmp_path / "reference-prompts")
    args = _args(tmp_path, repo, encoder, server, prompts)
    # the plan: one request a side per question, none for the judge
    assert main(["plan", str(CONSTRUCTION), *args]) == 0
    out = capsys.readouterr().out
    plan = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.strip()}
    n = sum(len(rows) for rows in by_config.values())
    assert plan["responses"][:6] == ["responses", "run", str(n), str(2 * n), "0", str(2 * n)]
    assert plan["judge"][:4] == ["judge", "run", str(n), "(no"], out  # "(no LLM calls)"
    assert server.request_count == 0

    assert main(["run", str(CONSTRUCTION), "--no-progress", *args]) == 0
    run_dir = tmp_path / "outputs" / "reference-construction"
    rd = RunDir(run_dir)

    # every input question is a pair, per subset: the given rubrics are kept whole
    pairs = list(rd.stage("pairs").rows())
    assert Counter(p["category"] for p in pairs) == {c: len(by_config[c]) for c in CONFIGS}
    assert sorted(p["source_id"] for p in pairs) == sorted(
        r["id"] for rows in by_config.values() for r in rows
    )
    one = next(p for p in pairs if p["source_id"] == "extra-one-aspect")
    assert len(one["rubric"]["items"]) == 1
    dup = next(p for p in pairs if p["source_id"] == "extra-near-duplicates")
    assert len(dup["rubric"]["items"]) == 2
    assert not list(rd.stage("pairs").rejects())
    # both stages count the combinations as unjudged, none as judged
    judge_stats = json.loads((run_dir / "judge" / "stats.json").read_text())
    pair_stats = json.loads((run_dir / "pairs" / "stats.json").read_text())
    assert (judge_stats["pairs_judged"], judge_stats["pairs_unjudged"]) == (0, len(pairs))
    assert (pair_stats["pairs_judged"], pair_stats["pairs_unjudged"]) == (0, len(pairs))

    # one request a side per question, nothing to the judge; each is the file's text
    bodies = [r["body"] for r in server.requests]
    assert len(bodies) == 2 * len(pairs)
    examples = {e["example_id"]: e for e in rd.stage("ingest").rows()}
    for p in pairs:
        ex = examples[p["example_id"]]
        posts = [ex["profile"][i] for i in ex["profile_view"]["order"]]
        profile = "\n".join(
            f"Post {i} (Category: {post['category']}):\n{post['text']}"
            for i, post in enumerate(posts, 1)
        )
        plan = ", ".join(it["aspect"] for it in p["rubric"]["items"])
        for template, side in ((CHOSEN, "chosen"), (REJECTED, "rejected")):
            want = (
                template.strip()
                .replace("{question}", p["question"])
                .replace("{profile}", profile)
                .replace("{plan}", plan)
            )
            sent = [b for b in bodies if b["messages"] == [{"role": "user", "content": want}]]
            assert len(sent) == 1, (side, p["source_id"])
        prov = p["provenance"]["generator"]
        assert prov["chosen"]["template"] == "chosen.txt"
        assert prov["rejected"]["template"] == "rejected.txt"
        assert p["provenance"]["judge"] == {"judged": False}
        assert p["judge"]["quality"] == {"chosen": None, "rejected": None}

    # the release: the profile in the run's ranked order, the ranking indexes it
    assert main(["publish", str(run_dir)]) == 0
    import pyarrow.parquet as pq

    (data,) = (run_dir / "publish" / "all").glob("*.parquet")
    rows = {r["id"]: r for r in pq.read_table(data).to_pylist()}
    assert len(rows) == len(pairs)
    # every aspect exactly as the input has it: none dropped, merged or trimmed
    given = {r["id"]: r for rows_ in by_config.values() for r in rows_}
    for source_id in EDGE_ROWS:
        want = [
            {"aspect": a["aspect"], "evidence": a.get("evidence") or "",
             "reason": a.get("reason") or ""}
            for a in given[source_id]["rubric_aspects"]
        ]  # fmt: skip
        assert rows[source_id]["rubric_aspects"] == want, source_id
        ids = rows[source_id]["rubric_item_ids"]
        assert len(ids) == len(want) == len(set(ids)), source_id
    assert rows["extra-empty-rubric"]["rubric_aspects"] == []
    for p in pairs:
        row = rows[p["source_id"]] if p["source_id"] in rows else rows[p["pair_id"]]
        order = p["profile_view"]["order"]
        ranked = [p["profile"][i]["text"] for i in order]
        assert [post["text"] for post in row["profile"][: len(order)]] == ranked
        assert row["profile_view"]["order"] == list(range(len(order)))
        assert sorted(post["text"] for post in row["profile"]) == sorted(
            post["text"] for post in p["profile"]
        )
        # nothing judged the pair: no judge sampling in its row
        assert json.loads(row["sampling"])["judge"] is None
    # the card: the prompt files by name and hash, no judge sampling
    card = (run_dir / "publish" / "README.md").read_text(encoding="utf-8")
    digest = hashlib.sha256((prompts / "chosen.txt").read_bytes()).hexdigest()
    assert f"- `chosen.txt` (a prompt file): `{digest}`" in card
    assert "- Judge sampling: n/a (nothing was judged)" in card

    # the commands that read a release read one with no verdicts
    assert main(["audit", str(run_dir / "publish")]) == 0
    assert main(["inspect", str(run_dir)]) == 0

    # a changed prompt file re-does the answers (its hash is in the stage's settings)
    _prompts(prompts, chosen=CHOSEN.replace("Cover these", "Cover all of these"))
    before = server.request_count
    assert main(["run", str(CONSTRUCTION), "--no-progress", *args]) == 0
    assert server.request_count - before == len(pairs)  # the chosen side only


@pytest.mark.parametrize(
    ("chosen", "rejected", "expected"),
    [
        (CHOSEN.replace("{plan}", "(none)"), REJECTED, "chosen.txt: has no {plan} placeholder"),
        (
            CHOSEN,
            REJECTED + "\nShort: {answer}",
            "rejected.txt, line 7: placeholder {answer} is not one the avoid_all prompt",
        ),
    ],
)
def test_a_prompt_file_without_its_placeholders_is_one_line(
    tmp_path, server, capsys, chosen, rejected, expected
):
    prompts = _prompts(tmp_path / "p", chosen, rejected)
    args = _args(tmp_path, tmp_path / "no-repo", "unused", server, prompts)
    assert main(["run", str(CONSTRUCTION), "--no-progress", *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert server.request_count == 0
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("where", ["fifo", "folder-is-a-file"])
def test_a_prompt_path_that_is_not_a_file_or_folder_says_what_it_is(
    tmp_path, server, capsys, where
):
    """A named pipe where a prompt file should be (read, it would wait for a writer) and a
    file where the prompt folder should be: each named for what it is, in one line."""
    import os

    prompts = _prompts(tmp_path / "p")
    if where == "fifo":
        (prompts / "rejected.txt").unlink()
        os.mkfifo(prompts / "rejected.txt")
        expected = "rejected.txt: is a named pipe, not a file; the avoid_all prompt"
    else:
        prompts = tmp_path / "a-file"
        prompts.write_text("not a folder", encoding="utf-8")
        expected = "a-file, field 'prompts.dir': is a file, not a folder; point prompts.dir at"
    args = _args(tmp_path, tmp_path / "no-repo", "unused", server, prompts)
    assert main(["plan", str(CONSTRUCTION), *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "outputs").exists()


def test_no_prompt_folder_says_which_field_to_set(tmp_path, server, capsys):
    args = _args(tmp_path, tmp_path / "no-repo", "unused", server, None)
    assert main(["run", str(CONSTRUCTION), "--no-progress", *args]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "field 'prompts.dir'" in line
    assert "prompts.files names chosen, avoid_all, but prompts.dir is not set" in line


def test_the_judge_off_refuses_a_filter_that_reads_verdicts(tmp_path, server, capsys):
    prompts = _prompts(tmp_path / "p")
    args = _args(tmp_path, tmp_path / "no-repo", "unused", server, prompts)
    args += ["--set", "pairs.filters=[truncated, coverage]"]
    assert main(["run", str(CONSTRUCTION), "--no-progress", *args]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "field 'pairs.filters'" in line and "coverage read the judge's verdicts" in line


def test_a_prompt_folder_relative_to_the_config_is_found_from_the_run_directory(
    tmp_path, server, capsys
):
    """run.yaml holds each path as the config meant it (absolute), so the commands that
    read a run from its directory find a prompt folder the config names relative to its
    own folder; before, it was looked for under the run directory."""
    folder = tmp_path / "my-configs"
    _prompts(folder / "pr")
    cfg = yaml.safe_load(CONSTRUCTION.read_text(encoding="utf-8"))
    cfg["run"] = {"name": "relative", "output_dir": "../outputs"}
    cfg["input"] = {"format": "lamp", "path": str(ROOT / "examples" / "sample_lamp.jsonl")}
    cfg["profile"] = {"ranker": "bm25", "top_k": 3}
    cfg["backend"]["openai"]["base_url"] = server.base_url
    cfg["backend"]["model"] = "standin-model"
    cfg["prompts"]["dir"] = "pr"  # the config file's folder's
    config = folder / "relative.yaml"
    config.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    assert main(["run", str(config), "--no-progress"]) == 0
    run_dir = tmp_path / "outputs" / "relative"
    recorded = yaml.safe_load((run_dir / "run.yaml").read_text(encoding="utf-8"))
    assert recorded["prompts"]["dir"] == str(folder / "pr")
    assert recorded["run"]["output_dir"] == str(tmp_path / "outputs")
    capsys.readouterr()
    for command in (["inspect", str(run_dir)], ["status", str(run_dir)]):
        assert main([*command, "--set", "pairs.chunk_size=5"]) == 0, capsys.readouterr().err
    assert main(["annotate", "export", str(run_dir), "--round", "1", "--file-only"]) == 0, (
        capsys.readouterr().err
    )
