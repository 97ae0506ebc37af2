"""prb eval judges asked with the user's own prompt files (system_prompt=, user_prompt=), the
reference's parse-failure rule (unparsed=a), and the mean of the per-category accuracies
beside the pooled one, against the test suite's stand-in OpenAI server (loopback only).

The prompt files here are HAND-WRITTEN test data in the reference's placeholder style (a
system turn without placeholders; a user turn with {question}, {Response_A} and
{Response_B}); they are not the reference's files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from eval_split import PROFILE_CANARY, crafted_rows, write_split
from standin_server import StandinServer

from pipeline.cli import main

# hand-written test data, not the reference's prompt text
SYSTEM_TEXT = """\

You are a test judge for prb's own tests. Read the question and the two responses.
Pick the response the asker would like more; the order shown is no reason to prefer one.

Reply in this format:
**Reasoning:** <a few words>
**Result:** <A or B>

"""
USER_TEXT = """\
Question from the user:
<<<
{question}
>>>

First response (A):
<<<
{Response_A}
>>>

Second response (B):
<<<
{Response_B}
>>>
"""
USER_WITH_PROFILE = "Posts the user wrote before:\n{profile}\n\n" + USER_TEXT

ROWS = {r["question"]: (i, r) for i, r in enumerate(crafted_rows())}
_QUESTION = re.compile(r"Question from the user:\n<<<\n(.*?)\n>>>", re.S)
_RESPONSE = re.compile(r"\(([AB])\):\n<<<\n(.*?)\n>>>", re.S)


def judge(body: dict[str, Any], _: int) -> str:
    """A crafted judge reading the hand-written user file's layout: right on pairs 0-2,
    always "A" on pair 3, no verdict on pair 4, the rejected answer on pair 5."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    i, row = ROWS[_QUESTION.search(user).group(1)]
    shown = dict(_RESPONSE.findall(user))
    chosen_letter = "A" if shown["A"] == row["chosen"] else "B"
    other = "B" if chosen_letter == "A" else "A"
    if i == 4:
        return "Both responses are fine; I cannot choose."
    letter = {3: "A", 5: other}.get(i, chosen_letter)
    return f"**Reasoning:** suits the asker\n**Result:** {letter}"


@pytest.fixture
def server():
    with StandinServer(responder=judge) as s:
        yield s


def _prompts(folder: Path, user: str = USER_TEXT) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    system = folder / "system.txt"
    user_file = folder / "user.txt"
    system.write_text(SYSTEM_TEXT, encoding="utf-8")
    user_file.write_text(user, encoding="utf-8")
    return system, user_file


def _spec(system: Path, user: Path, *extra: str) -> str:
    return ",".join(
        ["judge:standin-model", "format=text", f"system_prompt={system}", f"user_prompt={user}",
         *extra]
    )  # fmt: skip


def _args(split: Path, server: StandinServer, spec: str, *extra: str) -> list[str]:
    return [
        "eval", str(split), "--scorer", spec, "--no-progress", "--bootstrap", "20",
        "--set", f"backend.openai.base_url={server.base_url}",
        "--set", "backend.openai.max_concurrency=4",
        "--set", "backend.openai.timeout_s=120",  # generous: a busy machine is slow
        *extra,
    ]  # fmt: skip


def _only_folder(root: Path) -> Path:
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    return folder


def test_requests_are_the_system_file_then_the_user_file_filled(
    server: StandinServer, tmp_path: Path
) -> None:
    split = write_split(tmp_path)
    system, user = _prompts(tmp_path / "prompts")
    root = tmp_path / "ev"
    spec = _spec(system, user, "parse=first")
    assert main([*_args(split, server, spec, "--setting", "question"), "--out", str(root)]) == 0
    assert server.request_count == 12  # 6 pairs, both orders, no re-ask for free text
    rows = crafted_rows()
    seen = set()
    for req in server.requests:
        body = req["body"]
        assert "response_format" not in body
        assert [m["role"] for m in body["messages"]] == ["system", "user"]
        # the system file as the reference reads it (stripped at its ends), as written
        assert body["messages"][0]["content"] == SYSTEM_TEXT.strip()
        text = body["messages"][1]["content"]
        i = next(k for k, r in enumerate(rows) if r["question"] in text)
        r = rows[i]
        a, b = (r["chosen"], r["rejected"]) if f"<<<\n{r['chosen']}\n>>>\n\nSecond" in text else (
            r["rejected"], r["chosen"])  # fmt: skip
        expected = USER_TEXT.strip()
        for name, value in (("question", r["question"]), ("Response_A", a), ("Response_B", b)):
            expected = expected.replace("{" + name + "}", value)  # the reference's fill
        assert text == expected
        assert PROFILE_CANARY not in text  # the question setting shows no profile
        seen.add((i, a == r["chosen"]))
    assert len(seen) == 12  # every pair in both orders

    folder = _only_folder(root)
    res = json.loads((folder / "question" / "results.json").read_text())
    sha = {k: res["scorer"]["prompt"][k]["sha256"] for k in ("system_prompt", "user_prompt")}
    assert res["scorer"]["prompt"]["source"] == "files"
    assert res["scorer"]["prompt"]["user_prompt"]["file"] == "user.txt"  # the name, no folder
    assert res["template"]["user_prompt"]["template_hash"] == sha["user_prompt"]
    # the slug names each file by its hash, not its path
    assert f"system_prompt={sha['system_prompt'][:12]}" in folder.name
    assert f"user_prompt={sha['user_prompt'][:12]}" in folder.name
    assert "prompts" not in folder.name and "txt" not in folder.name
    m = res["settings"]["question"]["metrics"]
    assert (m["wins"], m["losses"], m["ties"], m["failed"]) == (3, 1, 1, 1)

    # an edited user file is another scorer: its own folder and cache, every request sent
    server.reset()
    user.write_text(USER_TEXT + "\nBe brief.\n", encoding="utf-8")
    assert main([*_args(split, server, spec, "--setting", "question"), "--out", str(root)]) == 0
    assert server.request_count == 12
    assert len([p for p in root.iterdir() if p.is_dir()]) == 2


def test_profile_placeholder_holds_the_posts_in_the_profile_setting_only(
    server: StandinServer, tmp_path: Path
) -> None:
    split = write_split(tmp_path)
    system, user = _prompts(tmp_path / "prompts", USER_WITH_PROFILE)
    root = tmp_path / "ev"
    args = _args(split, server, _spec(system, user), "--set", "profile.top_k=2")
    assert main([*args, "--out", str(root)]) == 0
    users = [next(m["content"] for m in r["body"]["messages"] if m["role"] == "user")
             for r in server.requests]  # fmt: skip
    with_posts = [u for u in users if PROFILE_CANARY in u]
    assert len(users) == 24 and len(with_posts) == 12
    for u in users:
        head = u.split("\n\nQuestion from the user:")[0]
        posts = head.removeprefix("Posts the user wrote before:").strip()
        if u in with_posts:
            lines = posts.split("\n")
            assert len(lines) == 2 and all(x.startswith("- ") for x in lines)
        else:
            assert posts == ""  # the question setting: the placeholder is empty


def test_unparsed_a_reads_a_verdict_without_result_as_a_and_counts_it(
    server: StandinServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    split = write_split(tmp_path)
    system, user = _prompts(tmp_path / "prompts")
    results = {}
    for rule in ("fail", "a"):
        root = tmp_path / f"ev-{rule}"
        spec = _spec(system, user, f"unparsed={rule}")
        assert main([*_args(split, server, spec, "--setting", "question"), "--out", str(root)]) == 0
        printed = capsys.readouterr().out
        folder = _only_folder(root)
        assert f"unparsed={rule}" in folder.name  # a figure-changing option: its own folder
        res = json.loads((folder / "question" / "results.json").read_text())
        scores = [json.loads(x) for x in (folder / "question" / "scores.jsonl").open()]
        results[rule] = (res, printed, {s["pair"]: s for s in scores})
    fail, as_a = results["fail"], results["a"]
    mf, ma = (r[0]["settings"]["question"]["metrics"] for r in (fail, as_a))
    # pair 4 has no verdict in either order: a failure by default ...
    assert (mf["wins"], mf["losses"], mf["ties"], mf["failed"]) == (3, 1, 1, 1)
    assert fail[0]["scorer"]["unparsed_verdicts_read_as"] == "failure"
    assert fail[2]["pair-4"]["verdicts"] == {"AB": None, "BA": None}
    # ... and "A" in both orders with unparsed=a: the chosen answer once, the rejected once
    assert (ma["wins"], ma["losses"], ma["ties"], ma["failed"]) == (3, 1, 2, 0)
    assert as_a[0]["scorer"]["unparsed_verdicts_read_as"] == "A"
    assert as_a[2]["pair-4"]["verdicts"] == {"AB": "A", "BA": "A"}
    assert all(r.startswith("no_verdict") for r in as_a[2]["pair-4"]["failures"].values())
    assert mf["unparsed_verdicts"] == ma["unparsed_verdicts"] == 2  # counted either way
    for _, printed, _ in (fail, as_a):
        header, row = printed.splitlines()[1:3]
        # name, setting, accuracy, the interval's two ends, by cat, ties, failed, unparsed
        assert header.split()[-1] == "unparsed" and row.split()[8] == "2"
    assert "unparsed verdicts read as 'A'" in as_a[1]
    assert "read as 'A'" not in fail[1]


def test_mean_of_categories_beside_the_pooled_accuracy(
    server: StandinServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    split = write_split(tmp_path)
    system, user = _prompts(tmp_path / "prompts")
    root = tmp_path / "ev"
    spec = _spec(system, user)
    assert main([*_args(split, server, spec, "--setting", "question"), "--out", str(root)]) == 0
    printed = capsys.readouterr().out
    res = json.loads((_only_folder(root) / "question" / "results.json").read_text())
    m = res["settings"]["question"]["metrics"]
    # Art: pairs 0-2 right (3/3); Life: pair 3 a tie, pair 4 failed, pair 5 wrong (0/2)
    assert m["by"]["category"]["Art"]["accuracy"] == 1.0
    assert m["by"]["category"]["Life"]["accuracy"] == 0.0
    assert m["accuracy"] == 0.6  # pooled: 3 wins of 5 scored pairs
    assert m["accuracy_mean_of_categories"] == 0.5  # (1.0 + 0.0) / 2
    row = printed.splitlines()[2]
    cells = row.split()  # name, setting, accuracy, the interval's two ends, by cat, ...
    assert cells[2] == "0.600" and cells[5] == "0.500"
    pos = m["position"]
    per_cat = [m["by"]["category"][c]["position"] for c in ("Art", "Life")]
    rates = [p["reference_order_correct"] / p["reference_order_scored"] for p in per_cat]
    assert pos["accuracy_reference_order_mean_of_categories"] == round(sum(rates) / 2, 4)
    assert f"by cat {pos['accuracy_reference_order_mean_of_categories']:.3f}" in row
    assert "by cat: the mean of the per-category accuracies" in printed


def test_no_categories_no_mean(server: StandinServer, tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "category"} for r in crafted_rows()]
    split = tmp_path / "flat.jsonl"
    split.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    system, user = _prompts(tmp_path / "prompts")
    root = tmp_path / "ev"
    spec = _spec(system, user)
    assert main([*_args(split, server, spec, "--setting", "question"), "--out", str(root)]) == 0
    m = json.loads((_only_folder(root) / "question" / "results.json").read_text())["settings"][
        "question"
    ]["metrics"]
    assert m["accuracy_mean_of_categories"] is None
    assert m["position"]["accuracy_reference_order_mean_of_categories"] is None


@pytest.mark.parametrize(
    ("extra", "files", "expected"),
    [
        ("format=json", {}, "prompt files ask for a free-text verdict"),
        ("", {}, "field 'format': prompt files ask for a free-text verdict"),
        ("format=text,only_user", {}, "option 'user_prompt' needs 'system_prompt'"),
        ("format=text", {"user.txt": "Q {question} A {Response_A}"},
         "user.txt: has no {Response_B} placeholder"),
        ("format=text", {"user.txt": USER_TEXT + "\n{narrative}"},
         "user.txt, line 16: placeholder {narrative} is not one the judge's user prompt can"),
        ("format=text", {"system.txt": "Judge {question} fairly."},
         "system.txt, line 1: placeholder {question} is not one the judge's system prompt"),
        ("format=text", {"system.txt": None}, "system.txt: does not exist"),
        ("format=text", {"system.txt": "   \n"}, "system.txt: is empty"),
    ],
)  # fmt: skip
def test_bad_prompt_files_are_one_line_before_anything_is_sent(
    server: StandinServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: str,
    files: dict[str, str | None],
    expected: str,
) -> None:
    split = write_split(tmp_path)
    system, user = _prompts(tmp_path / "prompts")
    for name, text in files.items():
        path = tmp_path / "prompts" / name
        if text is None:
            path.unlink()
        else:
            path.write_text(text, encoding="utf-8")
    opts = [o for o in extra.split(",") if o and o != "only_user"]
    parts = ["judge:standin-model", *opts, f"user_prompt={user}"]
    if "only_user" not in extra:
        parts.append(f"system_prompt={system}")
    assert main(_args(split, server, ",".join(parts), "--setting", "question")) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert expected in err
    assert server.request_count == 0
    assert not (tmp_path / "split-eval").exists()  # nothing written


def test_a_user_file_without_profile_refuses_the_profile_setting(
    server: StandinServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    split = write_split(tmp_path)
    system, user = _prompts(tmp_path / "prompts")
    # the default settings are question and profile: the file has no place for the profile
    assert main(_args(split, server, _spec(system, user))) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{user}, field 'user_prompt': has no {{profile}}" in err
    assert "--setting question" in err
    assert main(_args(split, server, _spec(system, user), "--setting", "rubric")) == 1
    assert "has no {rubric} placeholder" in capsys.readouterr().err
    assert server.request_count == 0
    assert not (tmp_path / "split-eval").exists()


def test_scorer_help_lists_the_new_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--scorer-help"]) == 0
    out = capsys.readouterr().out
    for option in ("system_prompt=", "user_prompt=", "unparsed='fail'", "device_map="):
        assert f"  {option}" in out
    docs = (Path(__file__).resolve().parent.parent / "docs" / "eval.md").read_text()
    for option in ("system_prompt=", "user_prompt=", "unparsed=a", "device_map=auto"):
        assert option in docs
    assert "prb eval correlate" in docs
