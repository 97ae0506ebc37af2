"""prb eval with pointwise reward models: a tiny random Llama classifier and a word-level
tokenizer built and saved here, loaded through the real from_pretrained path (no download)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from eval_split import (  # noqa: E402
    EVIDENCE_CANARY,
    HIDDEN,
    NARRATIVE_CANARY,
    PROFILE_CANARY,
    PROVENANCE_CANARIES,
    RUBRIC_CANARY,
    all_texts,
    crafted_rows,
    write_split,
)

from pipeline.cli import main  # noqa: E402
from pipeline.eval import pointwise  # noqa: E402
from pipeline.eval.data import build_pairs, user_turn  # noqa: E402
from pipeline.eval.pointwise import Encoder, TransformersScorer  # noqa: E402
from pipeline.eval.tiny import build_tiny_reward_model  # noqa: E402
from pipeline.types.profile import select_profile  # noqa: E402

SETTINGS = ("question", "profile", "rubric")


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_reward_model(tmp_path_factory.mktemp("rm") / "tiny-rm", all_texts())


@pytest.fixture(scope="module")
def tiny_rm3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rm3") / "tiny-rm3"
    return build_tiny_reward_model(folder, all_texts(), num_labels=3, seed=1)


def _convs() -> list[tuple[str, str]]:
    pairs = build_pairs(crafted_rows(), "crafted", top_k=3)
    out = []
    for setting in ("question", "profile"):
        for p in pairs:
            u = user_turn(p, setting)
            out += [(u, p.chosen), (u, p.rejected)]
    return out


def test_batched_scores_equal_one_at_a_time(tiny_rm: Path) -> None:
    enc = Encoder(tiny_rm)
    scorer = TransformersScorer(enc, batch_size=5, progress=False)
    assert (scorer.device, scorer.dtype) == ("cpu", "float32")
    ids = enc.encode(_convs())
    assert len({len(x) for x in ids}) > 3  # lengths differ: batches are padded
    batched = scorer.score_ids(ids)
    single = [scorer.score_ids([x])[0] for x in ids]
    assert batched == pytest.approx(single, abs=1e-5)
    assert len(set(batched)) > len(batched) // 2  # the scores really differ between inputs


def test_input_is_the_chat_template_of_question_then_answer(tiny_rm: Path) -> None:
    enc = Encoder(tiny_rm)
    row = crafted_rows()[0]
    (pair,) = build_pairs([row], "crafted")
    (ids,) = enc.encode([(user_turn(pair, "question"), row["chosen"])])
    expected = enc.tok.apply_chat_template(
        [
            {"role": "user", "content": row["question"]},
            {"role": "assistant", "content": row["chosen"]},
        ],
        tokenize=True,
    )
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert ids == list(expected)
    # special_tokens=true adds the tokenizer's own specials again, as the reference does
    (again,) = Encoder(tiny_rm, special_tokens=True).encode([(row["question"], row["chosen"])])
    assert len(again) >= len(ids)


def test_several_classes_score_is_last_class_probability(tiny_rm3: Path) -> None:
    enc = Encoder(tiny_rm3)
    scorer = TransformersScorer(enc, batch_size=4, progress=False)
    assert scorer.num_labels == 3
    ids = enc.encode(_convs()[:6])
    got = scorer.score_ids(ids)
    for x, s in zip(ids, got, strict=True):
        with torch.no_grad():
            logits = scorer.model(input_ids=torch.tensor([x])).logits[0]
        assert s == pytest.approx(torch.softmax(logits, -1)[-1].item(), abs=1e-6)
        assert 0.0 < s < 1.0
    assert pointwise.reduce_logits([2.0]) == 2.0
    assert pointwise.reduce_logits([0.0, math.log(3.0)]) == pytest.approx(0.75)


def _capture_inputs(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Record every input_ids row the model's forward receives, padding removed."""
    seen: list[list[int]] = []
    original = TransformersScorer.__init__

    def init(self: TransformersScorer, *a: Any, **kw: Any) -> None:
        original(self, *a, **kw)
        pad = self.encoder.tok.pad_token_id

        def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            for row, mask in zip(kwargs["input_ids"], kwargs["attention_mask"], strict=True):
                seen.append([int(t) for t, m in zip(row, mask, strict=True) if m])
            assert all(int(t) == pad for t, m in zip(row, mask, strict=True) if not m)

        self.model.register_forward_pre_hook(hook, with_kwargs=True)

    monkeypatch.setattr(TransformersScorer, "__init__", init)
    return seen


def _run(args: list[str]) -> int:
    return main(["eval", *args, "--no-progress"])


def test_no_answer_key_in_tokenised_inputs(
    tiny_rm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    split = write_split(tmp_path)
    seen = _capture_inputs(monkeypatch)
    spec = f"rm:{tiny_rm}"
    out = tmp_path / "ev"
    args = [str(split), "--scorer", spec, "--out", str(out)]
    assert _run([*args, "--setting", "question", "--setting", "profile"]) == 0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_rm))
    texts = [tok.decode(x) for x in seen]
    assert len(texts) == 2 * 2 * 6  # two settings, six pairs, two answers each
    for text in texts:
        for canary in HIDDEN:
            assert canary not in text, f"{canary} leaked into a reward model input"
    assert any(PROFILE_CANARY in t for t in texts)  # the profile setting did show posts
    assert not all(PROFILE_CANARY in t for t in texts)  # the question setting did not

    # The rubric-aware control shows the aspects, and only them: the scan does see a leak.
    seen.clear()
    assert _run([*args, "--setting", "rubric"]) == 0
    texts = [tok.decode(x) for x in seen]
    assert texts and all(RUBRIC_CANARY in t for t in texts)
    for text in texts:
        for canary in (EVIDENCE_CANARY, NARRATIVE_CANARY, *PROVENANCE_CANARIES):
            assert canary not in text


def test_profile_setting_shows_top_k_posts_in_rank_order(tiny_rm: Path) -> None:
    rows = crafted_rows()
    (pair,) = build_pairs(rows[:1], "crafted", top_k=2)
    want = select_profile(rows[0]["question"], rows[0]["profile"], 2, "bm25")
    assert pair.posts == tuple(p["text"] for p in want)
    turn = user_turn(pair, "profile")
    assert turn.index(want[0]["text"]) < turn.index(want[1]["text"]) < turn.index(pair.question)
    others = [p["text"] for p in rows[0]["profile"] if p not in want]
    assert all(o not in turn for o in others)
    assert user_turn(pair, "question") == pair.question  # the reference protocol's input


def test_cli_writes_results_and_leaderboard(
    tiny_rm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    split = write_split(tmp_path)
    spec = f"rm:{tiny_rm},batch_size=3"
    assert _run([str(split), "--scorer", spec, "--setting", "question", "--setting", "profile",
                 "--setting", "rubric", "--set", "profile.top_k=2"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "evaluated 6 pairs" in printed and "profile gain" in printed
    root = tmp_path / "split-eval"  # the default root beside a file
    folder = root / "rm-tiny-rm"  # batch_size changes no figure, so not the slug
    res = {s: json.loads((folder / s / "results.json").read_text()) for s in SETTINGS}
    for setting, doc in res.items():
        assert doc["scorer"]["slug"] == "rm-tiny-rm" and list(doc["settings"]) == [setting]
        assert doc["scorer"]["engine"] == "transformers"
        assert doc["profile_selection"] == {"top_k": 2, "ranker": "bm25", "pairs_with_profile": 6}
    assert res["rubric"]["settings"]["rubric"]["role"] == "control"
    per_file = {
        s: [json.loads(x) for x in (folder / s / "scores.jsonl").read_text().split()]
        for s in SETTINGS
    }
    scores = [row for rows in per_file.values() for row in rows]
    for setting, doc in res.items():
        m = doc["settings"][setting]["metrics"]
        mine = per_file[setting]  # each setting's scores file holds its own rows only
        assert len(mine) == 6 and {s["setting"] for s in mine} == {setting}
        wins = sum(s["chosen"] > s["rejected"] for s in mine)
        assert m["wins"] == wins and m["accuracy"] == round(wins / 6, 4)
        assert set(m["by"]) == {"category", "strategy", "human_verdict"}
        assert m["by"]["human_verdict"]["not annotated"]["pairs"] == 2
    q = {s["pair"]: s["chosen"] > s["rejected"] for s in scores if s["setting"] == "question"}
    p = {s["pair"]: s["chosen"] > s["rejected"] for s in scores if s["setting"] == "profile"}
    gain = res["profile"]["profile_gain"]["gain"]
    assert gain == round((sum(p.values()) - sum(q.values())) / 6, 4)

    board = [json.loads(x) for x in (root / "leaderboard.jsonl").read_text().splitlines()]
    assert sorted(r["setting"] for r in board) == ["profile", "question", "rubric"]
    md = (root / "leaderboard.md").read_text()
    assert "Validity controls (not scores)" in md
    assert md.index("| rubric |") > md.index("Validity controls")
    # the same scorer again replaces its rows; another scorer adds its own
    assert _run([str(split), "--scorer", spec, "--setting", "question"]) == 0
    assert _run([str(split), "--scorer", f"rm:{tiny_rm},special_tokens=true",
                 "--setting", "question"]) == 0  # fmt: skip
    board = [json.loads(x) for x in (root / "leaderboard.jsonl").read_text().splitlines()]
    assert len(board) == 4
    assert {r["scorer"] for r in board} == {"rm-tiny-rm", "rm-tiny-rm-special_tokens=true"}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("rm", "expected rm:MODEL_FOLDER or judge:MODEL_NAME"),
        ("model:/x", "expected rm:MODEL_FOLDER or judge:MODEL_NAME"),
        ("rm:", "rm: needs a model folder"),
        ("rm:{rm},batchsize=2", "did you mean 'batch_size'"),
        ("rm:{rm},batch_size=two", "option 'batch_size' expects int"),
        ("rm:{rm},engine=onnx", "option 'engine' must be one of transformers, vllm"),
        ("rm:{rm},fast", "must be key=value"),
        ("rm:{rm},vllm.enforce_eager=true", "vllm.* options need engine=vllm"),
        ("judge:m,format=xml", "option 'format' must be one of json, text"),
        ("judge:m,max_tokens=20", "raise max_tokens"),
        ("rm:{missing}", "no such model folder"),
        ("rm:{rm},reduce=softmax", "option 'reduce' must be one of exact, reference"),
        ("judge:m,format=text,parse=middle", "option 'parse' must be one of last, first"),
        ("judge:m,parse=first", "needs format=text"),
        # the judge's sampling options are bounded as the config's sampling fields are
        ("judge:m,temperature=.nan", "option 'temperature' must be a finite number"),
        ("judge:m,temperature=-1", "option 'temperature' must be greater than or equal to 0"),
        ("judge:m,temperature=2.5", "option 'temperature' must be less than or equal to 2"),
        ("judge:m,max_tokens=1e23", "option 'max_tokens' expects int"),
        ("judge:m,max_tokens=100000000000000000000000", "option 'max_tokens' must be less"),
        ("judge:m,max_tokens=0", "option 'max_tokens' must be greater than or equal to 1"),
    ],
)
def test_bad_scorer_specs_are_one_line_errors(
    spec: str,
    expected: str,
    tiny_rm: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    split = write_split(tmp_path)
    spec = spec.format(rm=tiny_rm, missing=tmp_path / "nope")
    assert _run([str(split), "--scorer", spec]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert expected in err
    assert not (tmp_path / "split-eval").exists()  # nothing written


def test_a_cut_weights_file_is_one_line_before_anything_runs(
    tiny_rm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from conftest import disk_state

    split = write_split(tmp_path)
    for cut in (lambda n: n - 100, lambda n: 5):  # a cut download; a stub of a file
        rm = tmp_path / "cut-rm"
        shutil.rmtree(rm, ignore_errors=True)
        shutil.copytree(tiny_rm, rm)
        weights = rm / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: cut(weights.stat().st_size)])
        before = disk_state(tmp_path)
        assert _run([str(split), "--scorer", f"rm:{rm}"]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {weights}") and "\n" not in err, err
        assert "download the model again" in err and "Traceback" not in err
        assert disk_state(tmp_path) == before  # nothing written, nothing removed


def test_a_cut_pytorch_bin_and_a_missing_shard_are_one_line(
    tiny_rm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    split = write_split(tmp_path)
    rm = tmp_path / "bin-rm"
    shutil.copytree(tiny_rm, rm)
    (rm / "model.safetensors").unlink()
    state = torch.nn.Linear(2, 2).state_dict()
    torch.save(state, rm / "pytorch_model.bin")  # the zip layout
    data = (rm / "pytorch_model.bin").read_bytes()
    (rm / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    assert _run([str(split), "--scorer", f"rm:{rm}"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {rm / 'pytorch_model.bin'}: not a whole weights file")
    (rm / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-00001-of-00002.safetensors"}})
    )
    assert _run([str(split), "--scorer", f"rm:{rm}"]) == 1
    err = capsys.readouterr().err.strip()
    assert "names the shard model-00001-of-00002.safetensors, which is missing" in err
    assert "\n" not in err and not (tmp_path / "split-eval").exists()


def test_the_question_is_sent_as_given(tiny_rm: Path) -> None:
    """Spaces and a newline at the question's ends reach the chat template untouched, as
    the reference sends them (its question is the user turn, untrimmed)."""
    row = {**crafted_rows()[0], "question": "  How can I practise drawing hands?\n"}
    (pair,) = build_pairs([row], "crafted")
    assert user_turn(pair, "question") == row["question"]
    enc = Encoder(tiny_rm)
    reference = enc.tok.apply_chat_template(
        [
            {"role": "user", "content": row["question"]},
            {"role": "assistant", "content": row["chosen"]},
        ],
        tokenize=False,
    )
    assert enc.texts([(user_turn(pair, "question"), row["chosen"])]) == [reference]
    assert f"<|user|> {row['question']} <|end|>" in reference
    # with the profile, the question ends the turn as given too
    assert user_turn(pair, "profile").endswith("Their question:\n" + row["question"])


def test_reference_reduction_is_the_softmax_in_the_model_dtype(tiny_rm3: Path) -> None:
    enc = Encoder(tiny_rm3)
    ids = enc.encode(_convs()[:6])
    exact = TransformersScorer(enc, dtype="bfloat16", progress=False)
    ref = TransformersScorer(enc, dtype="bfloat16", progress=False, reduce="reference")
    assert ref.info()["reduction"].startswith("reference:")
    assert exact.info()["reduction"].startswith("exact:")
    got_exact, got_ref = exact.score_ids(ids), ref.score_ids(ids)
    for x, e, r in zip(ids, got_exact, got_ref, strict=True):
        with torch.no_grad():
            logits = ref.model(input_ids=torch.tensor([x])).logits[0]  # bf16
        assert logits.dtype == torch.bfloat16
        assert r == torch.softmax(logits, dim=-1)[-1].item()  # bit for bit
        assert e == pytest.approx(torch.softmax(logits.double(), -1)[-1].item(), abs=1e-12)
    # bf16 keeps 8 bits: the reference's probabilities are on that grid, the exact ones not
    assert all(torch.tensor(r).bfloat16().item() == r for r in got_ref)
    assert any(torch.tensor(e).bfloat16().item() != e for e in got_exact)


def test_folder_without_config_and_missing_extra(
    tiny_rm: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    split = write_split(tmp_path)
    (tmp_path / "empty").mkdir()
    assert _run([str(split), "--scorer", f"rm:{tmp_path / 'empty'}"]) == 1
    err = capsys.readouterr().err
    assert "not a model folder (no config.json)" in err and str(tmp_path / "empty") in err

    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails as if not installed
    assert _run([str(split), "--scorer", f"rm:{tiny_rm}"]) == 1
    err = capsys.readouterr().err
    assert "pip install 'personalized-rewardbench[eval]'" in err and "\n" not in err.strip()


def test_model_without_chat_template_needs_template_pair(tiny_rm: Path, tmp_path: Path) -> None:
    import shutil

    from pipeline.core.errors import InputError

    bare = tmp_path / "bare"
    shutil.copytree(tiny_rm, bare)
    (bare / "chat_template.jinja").unlink()
    cfg = json.loads((bare / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="template=pair"):
        Encoder(bare)
    enc = Encoder(bare, template="pair")
    (ids,) = enc.encode([("Sketch hands", "Bake daily")])
    assert enc.tok.decode(ids).split() == ["Sketch", "hands", "Bake", "daily"]


def test_long_inputs_are_cut_and_counted(tiny_rm: Path) -> None:
    enc = Encoder(tiny_rm, max_length=12)
    ids = enc.encode(_convs()[:4])
    assert all(len(x) <= 12 for x in ids)
    assert enc.truncated == 4


def test_a_runs_release_in_parquet(tiny_rm: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    run = tmp_path / "run"
    (run / "publish" / "all").mkdir(parents=True)
    (run / "run.yaml").write_text("run: {name: run}\nbackend: {}\n")
    rows = crafted_rows()
    for r in rows:
        r["sampling"] = str(r["sampling"])
    pq.write_table(pa.Table.from_pylist(rows), run / "publish" / "all" / "test.parquet")
    assert _run([str(run), "--scorer", f"rm:{tiny_rm}", "--setting", "question"]) == 0
    res = json.loads((run / "eval" / "rm-tiny-rm" / "question" / "results.json").read_text())
    assert res["split"]["format"] == "release" and res["split"]["rows"] == 6
    assert (run / "eval" / "leaderboard.md").exists()
