"""The input-format registry: a new format is a class and a registration, both in this
module alone (a CSV reader), and `prb run` ingests with it; the registry refuses a
duplicate name and a class that is not an InputFormat, and the config names the closest
format for a typo."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import write_config

from pipeline.config import InputSection, load_config
from pipeline.core.errors import ConfigError, InputError
from pipeline.core.ids import stable_id
from pipeline.inputs import FORMATS, InputFormat
from pipeline.inputs.base import Loc, Unique, example_row, profile, question_fields
from pipeline.inputs.ingest import expected_examples, load_examples
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.run import RunDir


class CsvFormat(InputFormat):
    """One question per CSV record: id, question, category and ``posts``, the asker's past
    posts as a JSON list of {id, text}. A quoted cell may span lines."""

    summary = "CSV: id, question, category, posts (JSON)."

    @classmethod
    def path_fields(cls, section):
        return [("input.path", section.path, "file")]

    @classmethod
    def detect(cls, path: Path) -> bool:
        return path.suffix.lower() == ".csv"

    def _records(self) -> Iterator[tuple[Loc, dict]]:
        path = self.need_path("path")
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            start = reader.line_num + 1
            for rec in reader:
                yield Loc(path, start), rec
                start = reader.line_num + 1

    def count(self) -> int:
        return sum(1 for _ in self._records())

    def read(self) -> Iterator[dict]:
        keys = {
            "source_id": "id",
            "question": "question",
            "category": "category",
            "narrative": "narrative",
            "rubric_aspects": "rubric_aspects",
        }
        ids = Unique("id")
        for loc, rec in self._records():
            fields = question_fields(rec, loc, keys)
            ids.add(fields["source_id"], "id", loc)
            try:
                posts = json.loads(rec.get("posts") or "")
            except ValueError:
                raise loc.fail("posts", "must be a JSON list of {id, text}") from None
            yield example_row(fields, fields["source_id"], profile(posts, "posts", loc))


@pytest.fixture
def csv_format():
    FORMATS.register("csv", CsvFormat)
    yield CsvFormat
    FORMATS.unregister("csv")


def _posts(*texts: str) -> str:
    return json.dumps([{"id": f"p{i}", "text": t} for i, t in enumerate(texts)])


def _write_csv(path: Path, rows: list[list[str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "question", "category", "posts"])
        writer.writerows(rows)
    return path


ROWS = [
    ["q1", "How do I keep my\nsourdough starter alive?", "Lifestyle", _posts("I bake bread.")],
    ["q2", "Which paper suits\nwatercolor\nwashes?", "Art", _posts("I paint.", "I sketch.")],
    ["q3", "Is a road bike worth it?", "", _posts("I cycle to work.")],
]


def test_a_csv_format_added_here_runs_ingest(csv_format, tmp_path, server):
    src = _write_csv(tmp_path / "questions.csv", ROWS)
    # 1 header + 3 records over 7 physical lines: counting lines would say 6 examples
    assert len(src.read_text().splitlines()) == 7
    cfg = load_config(write_config(tmp_path, server, input={"format": "csv", "path": str(src)}))
    assert expected_examples(cfg.input, cfg.resolve_input) == 3

    said: list[str] = []
    stats = run_pipeline(cfg, until="ingest", progress=False, echo=said.append)
    assert "[ingest] running (3 examples)" in said
    assert stats["ingest"]["examples"] == 3

    rows = list(RunDir(tmp_path / "outputs" / "t").stage("ingest").rows())
    assert [r["source_id"] for r in rows] == ["q1", "q2", "q3"]
    assert [r["example_id"] for r in rows] == [stable_id("example", s) for s in ("q1", "q2", "q3")]
    assert rows[1]["question"] == "Which paper suits\nwatercolor\nwashes?"
    assert rows[1]["profile"] == [
        {"id": "p0", "category": None, "text": "I paint."},
        {"id": "p1", "category": None, "text": "I sketch."},
    ]
    assert [r["category"] for r in rows] == ["Lifestyle", "Art", ""]
    assert rows[1]["profile_view"]["order"] in ([0, 1], [1, 0])


def test_the_csv_errors_name_the_record_line_and_field(csv_format, tmp_path):
    src = _write_csv(tmp_path / "q.csv", [*ROWS[:2], ["q3", "Fine?", "", "not json"]])
    with pytest.raises(InputError) as info:
        load_examples(InputSection(format="csv", path=src))
    # the third record starts on physical line 7 (the cells above span lines)
    assert str(info.value) == f"{src}, line 7, field 'posts': must be a JSON list of {{id, text}}"


def test_the_registry_refuses_a_duplicate_and_a_non_format(csv_format):
    with pytest.raises(ValueError, match="input format 'csv' is already registered"):
        FORMATS.register("csv", CsvFormat)
    with pytest.raises(ValueError, match="input format 'lamp' is already registered"):
        FORMATS.register("lamp", CsvFormat)

    class NotAFormat:
        pass

    with pytest.raises(TypeError, match=r"not a subclass of pipeline\.inputs\.base\.InputFormat"):
        FORMATS.register("other", NotAFormat)  # type: ignore[arg-type]
    assert "other" not in FORMATS
    assert FORMATS.get("csv") is CsvFormat and CsvFormat.name == "csv"
    assert FORMATS.detect(Path("x.csv")) == "csv"


def test_the_config_lists_the_registered_formats_and_suggests_one(tmp_path, csv_format):
    bad = write_config(tmp_path, input={"format": "lmap"})
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert str(info.value) == (
        f"{bad}, field 'input.format': unknown input format 'lmap'. Did you mean 'lamp'? "
        "Known: lamp, generic, hf, hub, csv"
    )


def test_detection_knows_the_built_in_shapes(tmp_path):
    from lamp_repo import SAMPLE

    assert FORMATS.detect(SAMPLE) == "lamp"
    generic = Path(__file__).resolve().parent.parent / "examples" / "generic"
    assert FORMATS.detect(generic / "questions.jsonl") == "generic"
    assert FORMATS.detect(tmp_path) is None  # an empty folder is nothing yet


def test_a_table_given_as_jsonl_names_the_format_it_looks_like(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(
        [{"id": "1", "question": "Why?", "profile": [{"id": "a", "text": "A post."}]}]
    )
    ds.to_parquet(str(tmp_path / "x.parquet"))
    with pytest.raises(InputError) as info:
        load_examples(InputSection(format="lamp", path=tmp_path / "x.parquet"))
    assert str(info.value).endswith("; the file looks like input.format 'hf'")
    ds.save_to_disk(str(tmp_path / "saved"))
    cfg = write_config(tmp_path, input={"format": "lamp", "path": str(tmp_path / "saved")})
    with pytest.raises(ConfigError) as info2:
        load_config(cfg)
    assert str(info2.value).endswith(
        "is a folder, not a JSONL file; point input.path at a JSONL file; it looks like "
        "input.format 'hf'"
    )
