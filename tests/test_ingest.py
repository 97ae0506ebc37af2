"""Tests for pipeline.inputs.ingest: the three input formats and clear errors on bad input."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pipeline.config import InputSection
from pipeline.core.errors import InputError
from pipeline.core.ids import stable_id
from pipeline.inputs.ingest import load_examples

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_LAMP = ROOT / "examples" / "sample_lamp.jsonl"
GENERIC = ROOT / "examples" / "generic"
CATEGORIES = ("Art_and_Entertainment", "Lifestyle_and_Personal_Development", "Society_and_Culture")
KEYS = [
    "example_id",
    "source_id",
    "user_id",
    "question",
    "category",
    "profile",
    "narrative",
    "rubric_aspects",
]


def _row(i: int | str = 1, **over) -> dict:
    row = {
        "id": str(i),
        "question": f"Question number {i}?",
        "profile": [{"id": "p1", "category": "Lifestyle", "text": "A past post."}],
    }
    row.update(over)
    return row


def _write_jsonl(path: Path, rows: list) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _check_contract(row: dict) -> None:
    assert list(row) == KEYS
    assert row["example_id"] == stable_id("example", row["source_id"])
    assert isinstance(row["question"], str) and row["question"].strip()
    assert all(set(p) == {"id", "category", "text"} for p in row["profile"])
    if row["rubric_aspects"] is not None:
        assert all(set(a) == {"aspect", "evidence", "reason"} for a in row["rubric_aspects"])


# --- lamp ------------------------------------------------------------------------------


def test_lamp_sample_file() -> None:
    cfg = InputSection(format="lamp", path=SAMPLE_LAMP)
    rows = load_examples(cfg)
    assert len(rows) == 12
    assert Counter(r["category"] for r in rows) == {c: 4 for c in CATEGORIES}
    ids = [r["example_id"] for r in rows]
    assert len(set(ids)) == 12
    assert [r["example_id"] for r in load_examples(cfg)] == ids  # stable across loads
    for r in rows:
        _check_contract(r)
        assert r["user_id"] == r["source_id"]  # LaMP-QA: one asker per question
        assert 5 <= len(r["profile"]) <= 15
        assert 2 <= len(r["rubric_aspects"]) <= 4
        assert r["narrative"]
        assert "_note" not in r


def test_lamp_types_defaults_and_unknown_keys(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "in.jsonl",
        [
            _row(7, id=7, _note="ignored", rubric_aspects=[{"aspect": "Be brief"}]),
            "",
            "   ",
            _row(
                8,
                user_id=42,
                category="Made_Up_Category",
                narrative="I want it short.",
                profile=[{"id": 3, "text": "post"}],
            ),
        ],
    )
    rows = load_examples(InputSection(format="lamp", path=path))
    assert [r["source_id"] for r in rows] == ["7", "8"]
    first, second = rows
    assert first["user_id"] == "7"
    assert first["category"] is None and first["narrative"] is None
    assert first["rubric_aspects"] == [{"aspect": "Be brief", "evidence": "", "reason": ""}]
    assert second["user_id"] == "42"
    assert second["category"] == "Made_Up_Category"
    assert second["rubric_aspects"] is None
    assert second["profile"] == [{"id": "3", "category": None, "text": "post"}]
    for r in rows:
        _check_contract(r)


def test_limit_keeps_first_n_but_validates_everything(tmp_path: Path) -> None:
    rows = [_row(i) for i in range(1, 6)]
    path = _write_jsonl(tmp_path / "in.jsonl", rows)
    got = load_examples(InputSection(format="lamp", path=path, limit=2))
    assert [r["source_id"] for r in got] == ["1", "2"]

    _write_jsonl(path, [*rows, _row(6, question="")])
    with pytest.raises(InputError) as exc:
        load_examples(InputSection(format="lamp", path=path, limit=2))
    assert exc.value.line == 6


def test_resolve_is_applied_to_paths(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "in.jsonl", [_row(1)])
    seen = []

    def resolve(p: Path | None) -> Path | None:
        seen.append(p)
        return None if p is None else tmp_path / p

    rows = load_examples(InputSection(format="lamp", path=Path("in.jsonl")), resolve)
    assert len(rows) == 1
    assert seen == [Path("in.jsonl")]


def test_missing_path_setting_is_an_error() -> None:
    with pytest.raises(InputError) as exc:
        load_examples(InputSection(format="generic", users_path=GENERIC / "users.jsonl"))
    assert exc.value.field == "input.questions_path"


# --- generic ---------------------------------------------------------------------------


def test_generic_sample_files() -> None:
    cfg = InputSection(
        format="generic",
        users_path=GENERIC / "users.jsonl",
        questions_path=GENERIC / "questions.jsonl",
    )
    rows = load_examples(cfg)
    assert [r["source_id"] for r in rows] == ["gq-1", "gq-2", "gq-3", "gq-4"]
    assert [r["user_id"] for r in rows] == ["u-maya", "u-tomas", "u-tomas", "u-priya"]
    assert len({r["user_id"] for r in rows}) == 3
    for r in rows:
        _check_contract(r)
    # The user's profile is attached to each of their questions, as separate copies.
    assert rows[1]["profile"] == rows[2]["profile"]
    assert rows[1]["profile"] is not rows[2]["profile"]
    assert rows[1]["profile"][0] is not rows[2]["profile"][0]
    assert [p["id"] for p in rows[0]["profile"]] == ["maya-p01", "maya-p02", "maya-p03"]
    assert rows[0]["rubric_aspects"][1]["reason"] == ""
    assert rows[3]["category"] is None and rows[3]["rubric_aspects"] is None
    assert load_examples(cfg) == rows


# --- hf --------------------------------------------------------------------------------


def _hf_source_rows() -> list[dict]:
    return [
        {
            "qid": 100 + i,
            "query": f"Source question {i}?",
            "history": [
                {"id": f"h{i}a", "category": "Art", "text": "first post"},
                {"id": f"h{i}b", "category": None, "text": "second post"},
            ],
            "rubric_aspects": [{"aspect": "Mentions jazz", "evidence": "Collects records"}],
            "category": "Society_and_Culture",
            "extra_column": "ignored",
        }
        for i in range(3)
    ]


MAPPING = {"source_id": "qid", "question": "query", "profile": "history"}


def _check_hf_rows(rows: list[dict]) -> None:
    assert [r["source_id"] for r in rows] == ["100", "101", "102"]
    assert [r["user_id"] for r in rows] == ["100", "101", "102"]
    assert rows[1]["question"] == "Source question 1?"
    assert rows[0]["profile"][1] == {"id": "h0b", "category": None, "text": "second post"}
    assert rows[0]["rubric_aspects"] == [
        {"aspect": "Mentions jazz", "evidence": "Collects records", "reason": ""}
    ]
    assert rows[0]["narrative"] is None  # no such column
    assert rows[2]["category"] == "Society_and_Culture"
    for r in rows:
        _check_contract(r)


def test_hf_saved_dataset_with_mapping(tmp_path: Path) -> None:
    import datasets

    folder = tmp_path / "ds"
    datasets.Dataset.from_list(_hf_source_rows()).save_to_disk(str(folder))
    cfg = InputSection(format="hf", path=folder, columns=MAPPING)
    rows = load_examples(cfg)
    _check_hf_rows(rows)
    assert load_examples(cfg) == rows
    assert len(load_examples(InputSection(format="hf", path=folder, columns=MAPPING, limit=1))) == 1


def test_hf_parquet_with_mapping(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(_hf_source_rows()), path)
    _check_hf_rows(load_examples(InputSection(format="hf", path=path, columns=MAPPING)))


def test_hf_user_id_column_and_default_names(tmp_path: Path) -> None:
    import datasets

    folder = tmp_path / "ds"
    src = [_row(1, user_id="alice"), _row(2, user_id=None)]
    datasets.Dataset.from_list(src).save_to_disk(str(folder))
    rows = load_examples(InputSection(format="hf", path=folder))
    assert [r["user_id"] for r in rows] == ["alice", "2"]


def _save_dict(folder: Path) -> None:
    import datasets

    src = _hf_source_rows()
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(src[:2]),
            "test": datasets.Dataset.from_list(src[2:]),
        }
    ).save_to_disk(str(folder))


def test_hf_dataset_dict_split(tmp_path: Path) -> None:
    folder = tmp_path / "dd"
    _save_dict(folder)
    test = load_examples(InputSection(format="hf", path=folder, split="test", columns=MAPPING))
    train = load_examples(InputSection(format="hf", path=folder, split="train", columns=MAPPING))
    assert [r["source_id"] for r in test] == ["102"]
    assert [r["source_id"] for r in train] == ["100", "101"]


@pytest.mark.parametrize("split", [None, "validation"])
def test_hf_dataset_dict_bad_split_lists_splits(tmp_path: Path, split: str | None) -> None:
    folder = tmp_path / "dd"
    _save_dict(folder)
    with pytest.raises(InputError) as exc:
        load_examples(InputSection(format="hf", path=folder, split=split, columns=MAPPING))
    assert exc.value.path == str(folder)
    assert exc.value.field == "split"
    assert "test" in str(exc.value) and "train" in str(exc.value)


def test_hf_unknown_mapping_field(tmp_path: Path) -> None:
    import datasets

    folder = tmp_path / "ds"
    datasets.Dataset.from_list(_hf_source_rows()).save_to_disk(str(folder))
    with pytest.raises(InputError) as exc:
        load_examples(InputSection(format="hf", path=folder, columns={**MAPPING, "qestion": "q"}))
    assert exc.value.field == "columns.qestion"
    assert "known fields" in str(exc.value)


def test_hf_folder_that_is_not_a_dataset(tmp_path: Path) -> None:
    (tmp_path / "junk").mkdir()
    with pytest.raises(InputError) as exc:
        load_examples(InputSection(format="hf", path=tmp_path / "junk"))
    assert exc.value.path == str(tmp_path / "junk")
    assert "save_to_disk" in str(exc.value)


# --- bad input -------------------------------------------------------------------------

GOOD = json.dumps(_row(1))


def _lamp(lines: list) -> dict:
    return {"files": {"in.jsonl": lines}, "cfg": {"format": "lamp", "path": "in.jsonl"}}


def _generic(users: list, questions: list) -> dict:
    return {
        "files": {"users.jsonl": users, "questions.jsonl": questions},
        "cfg": {
            "format": "generic",
            "users_path": "users.jsonl",
            "questions_path": "questions.jsonl",
        },
    }


USER = {"user_id": "u1", "profile": [{"id": "p", "text": "post"}]}
QUESTION = {"id": "q1", "user_id": "u1", "question": "Why?"}

BAD_CASES = {
    "bad_json": (_lamp([GOOD, '{"id": "2", "question": "x"']), "in.jsonl", 2, None, "JSON"),
    "non_object": (_lamp([GOOD, "", "[1, 2, 3]"]), "in.jsonl", 3, None, "object"),
    "missing_question": (
        _lamp([GOOD, {"id": "2", "profile": []}]),
        "in.jsonl",
        2,
        "question",
        "missing",
    ),
    "empty_question": (_lamp([_row(1, question="  ")]), "in.jsonl", 1, "question", "empty"),
    "question_not_string": (_lamp([_row(1, question=5)]), "in.jsonl", 1, "question", "integer"),
    "profile_not_list": (_lamp([_row(1, profile="posts")]), "in.jsonl", 1, "profile", "list"),
    "profile_item_missing_text": (
        _lamp([_row(1, profile=[{"id": "a", "text": "ok"}, {"id": "b"}])]),
        "in.jsonl",
        1,
        "profile[1].text",
        "missing",
    ),
    "profile_item_not_object": (
        _lamp([_row(1, profile=["just text"])]),
        "in.jsonl",
        1,
        "profile[0]",
        "object",
    ),
    "rubric_missing_aspect": (
        _lamp([_row(1, rubric_aspects=[{"evidence": "e", "reason": "r"}])]),
        "in.jsonl",
        1,
        "rubric_aspects[0].aspect",
        "missing",
    ),
    "duplicate_id": (_lamp([_row(1), _row(2), _row(1)]), "in.jsonl", 3, "id", "line 1"),
    "generic_unknown_user": (
        _generic([USER], [QUESTION, {**QUESTION, "id": "q2", "user_id": "ghost"}]),
        "questions.jsonl",
        2,
        "user_id",
        "ghost",
    ),
    "generic_duplicate_user": (
        _generic([USER, USER], [QUESTION]),
        "users.jsonl",
        2,
        "user_id",
        "line 1",
    ),
    "missing_file": (
        {"files": {}, "cfg": {"format": "lamp", "path": "nope.jsonl"}},
        "nope.jsonl",
        None,
        None,
        "not found",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CASES), ids=list(BAD_CASES))
def test_bad_jsonl_input(tmp_path: Path, case: str) -> None:
    spec, bad_file, line, field, words = BAD_CASES[case]
    for name, lines in spec["files"].items():
        _write_jsonl(tmp_path / name, lines)
    cfg = InputSection(**spec["cfg"])
    with pytest.raises(InputError) as exc:
        load_examples(cfg, lambda p: None if p is None else tmp_path / p)
    err = exc.value
    msg = str(err)
    assert err.path == str(tmp_path / bad_file)
    assert err.line == line
    assert err.field == field
    assert str(tmp_path / bad_file) in msg
    if line is not None:
        assert f"line {line}" in msg
    if field is not None:
        assert f"'{field}'" in msg
    assert words in msg


def _hf_bad(tmp_path: Path, rows: list[dict], columns: dict) -> InputError:
    import datasets

    folder = tmp_path / "ds"
    datasets.Dataset.from_list(rows).save_to_disk(str(folder))
    with pytest.raises(InputError) as exc:
        load_examples(InputSection(format="hf", path=folder, columns=columns))
    assert exc.value.path == str(folder)
    assert str(folder) in str(exc.value)
    return exc.value


def test_hf_missing_mapped_column(tmp_path: Path) -> None:
    err = _hf_bad(tmp_path, _hf_source_rows(), {**MAPPING, "narrative": "story"})
    assert err.line is None
    assert err.field == "story"
    assert "'story'" in str(err) and "narrative" in str(err) and "query" in str(err)


def test_hf_missing_required_column_unmapped(tmp_path: Path) -> None:
    err = _hf_bad(tmp_path, _hf_source_rows(), {"source_id": "qid", "profile": "history"})
    assert err.field == "question"
    assert "input.columns.question" in str(err)


def test_hf_bad_row_names_row(tmp_path: Path) -> None:
    src = _hf_source_rows()
    src[1]["query"] = ""
    err = _hf_bad(tmp_path, src, MAPPING)
    assert err.line == 2
    assert err.field == "query"
    assert "row 2" in str(err) and "line 2" in str(err) and "'query'" in str(err)


def test_hf_bad_nested_row_and_duplicate(tmp_path: Path) -> None:
    src = _hf_source_rows()
    src[2]["history"][0]["text"] = None
    err = _hf_bad(tmp_path, src, MAPPING)
    assert (err.line, err.field) == (3, "history[0].text")

    src = _hf_source_rows()
    src[2]["qid"] = src[0]["qid"]
    err = _hf_bad(tmp_path / "dup", src, MAPPING)
    assert (err.line, err.field) == (3, "qid")
    assert "row 1" in str(err)
