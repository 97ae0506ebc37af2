"""Fuzzing: malformed input JSONL, YAML configs and pairs files never escape as a traceback.

Hypothesis generates the files (random bytes, truncated JSON, wrong types, deep nesting,
5,000-digit integers, lone surrogates, YAML tags) and feeds them to ingest, config loading
and the audit. The only exceptions allowed out are ``pipeline.core.errors.PipelineError``
subclasses, which the CLI prints as one line. What does load must also be safe for the
later stages: ingested rows encode as UTF-8 JSON, and a loaded config writes a run.yaml
that loads again to the same settings.

Each test is bounded (``max_examples`` and a per-example ``deadline``) to stay under
about 20 seconds.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pipeline.config import Config, InputSection, load_config
from pipeline.core.errors import PipelineError
from pipeline.inputs.ingest import load_examples

FUZZ = settings(
    max_examples=250,
    # no per-example deadline: what is checked is the outcome, not the speed; a busy
    # machine (load 3-12) took many times the usual milliseconds, and pytest-timeout still
    # stops a real hang
    deadline=None,
    database=None,  # nothing written into the working tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# the audit fits a probe model per file: fewer examples for the same time
AUDIT_FUZZ = settings(FUZZ, max_examples=120)
# an import writes the round's five files, each fsynced: slow on a busy disk
IMPORT_FUZZ = settings(FUZZ, max_examples=150)


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    # a module-level folder: hypothesis runs many examples per test function call
    d = Path(tempfile.mkdtemp(prefix="prb-fuzz-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


# ---- strategies --------------------------------------------------------------------------

leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_value = st.recursive(
    leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
post = st.one_of(
    st.fixed_dictionaries(
        {}, optional={"id": json_value, "text": json_value, "category": json_value}
    ),
    json_value,
)
aspect = st.one_of(
    st.fixed_dictionaries(
        {}, optional={"aspect": json_value, "evidence": json_value, "reason": json_value}
    ),
    json_value,
)
# a row that is mostly the right shape, with any field of any type
lamp_row = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.text(max_size=8), st.integers(), json_value),
        "user_id": st.one_of(st.text(max_size=8), json_value),
        "question": st.one_of(st.text(max_size=30), json_value),
        "category": json_value,
        "narrative": json_value,
        "profile": st.one_of(st.lists(post, max_size=3), json_value),
        "rubric_aspects": st.one_of(st.lists(aspect, max_size=3), json_value),
    },
)
GOOD_ROW = {"id": "q1", "question": "How?", "profile": [{"id": "p1", "text": "I paint."}]}


@st.composite
def damaged_line(draw: st.DrawFn, rows: st.SearchStrategy = lamp_row) -> bytes:
    """One line of a JSONL file: valid, wrong, truncated, nested, huge or undecodable."""
    row = draw(rows)
    text = json.dumps(row, ensure_ascii=draw(st.booleans()), allow_nan=True)
    kind = draw(
        st.sampled_from(
            ["row", "good", "truncated", "deep", "bigint", "surrogate", "bytes", "text", "scalar"]
        )
    )
    if kind == "good":
        text = json.dumps(GOOD_ROW | {"id": draw(st.text(min_size=1, max_size=5))})
    elif kind == "truncated":
        text = text[: draw(st.integers(0, max(0, len(text) - 1)))]
    elif kind == "deep":
        depth = draw(st.integers(1, 5000))
        text = json.dumps(GOOD_ROW)[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"
    elif kind == "bigint":
        digits = draw(st.integers(4000, 6000))
        text = json.dumps(GOOD_ROW).replace('"q1"', "7" * digits)
    elif kind == "surrogate":
        escape = "\\u" + draw(st.sampled_from(["d800", "DBFF", "dc00", "dfff", "d83d"]))
        field = draw(st.sampled_from(["How?", "I paint.", "q1", "p1"]))
        text = json.dumps(GOOD_ROW).replace(field, field[:1] + escape + field[1:])
    elif kind == "bytes":
        return draw(st.binary(max_size=60)).replace(b"\n", b" ")
    elif kind == "text":
        text = draw(st.text(max_size=60))
    elif kind == "scalar":
        text = json.dumps(draw(json_value), allow_nan=True)
    return text.replace("\n", " ").encode("utf-8", "surrogatepass")


@st.composite
def jsonl_file(draw: st.DrawFn, rows: st.SearchStrategy = lamp_row) -> bytes:
    lines = draw(st.lists(damaged_line(rows), max_size=5))
    sep = draw(st.sampled_from([b"\n", b"\r\n"]))
    bom = draw(st.sampled_from([b"", b"\xef\xbb\xbf"]))
    return bom + sep.join(lines) + draw(st.sampled_from([b"", sep]))


def _assert_rows_are_safe(rows: list[dict]) -> None:
    """What ingest returns must be writable by the next stages (UTF-8 JSON, no NaN ids)."""
    assert rows
    json.dumps(rows, ensure_ascii=False, allow_nan=False).encode("utf-8")
    for r in rows:
        assert isinstance(r["example_id"], str) and isinstance(r["question"], str)


# ---- ingest ------------------------------------------------------------------------------


@FUZZ
@given(data=jsonl_file())
def test_lamp_ingest_raises_only_pipeline_errors(scratch: Path, data: bytes) -> None:
    path = scratch / "lamp.jsonl"
    path.write_bytes(data)
    try:
        rows = load_examples(InputSection(format="lamp", path=path))
    except PipelineError as exc:
        assert str(path) in str(exc)
        return
    _assert_rows_are_safe(rows)


users_row = st.fixed_dictionaries(
    {},
    optional={
        "user_id": st.one_of(st.sampled_from(["u1", "u2"]), json_value),
        "profile": st.one_of(st.lists(post, max_size=3), json_value),
    },
)
questions_row = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.text(max_size=8), st.integers(), json_value),
        "user_id": st.one_of(st.sampled_from(["u1", "u2"]), json_value),
        "question": st.one_of(st.text(max_size=30), json_value),
        "category": json_value,
    },
)


@FUZZ
@given(users=jsonl_file(users_row), questions=jsonl_file(questions_row))
def test_generic_ingest_raises_only_pipeline_errors(
    scratch: Path, users: bytes, questions: bytes
) -> None:
    u, q = scratch / "users.jsonl", scratch / "questions.jsonl"
    u.write_bytes(users)
    q.write_bytes(questions)
    try:
        rows = load_examples(InputSection(format="generic", users_path=u, questions_path=q))
    except PipelineError:
        return
    _assert_rows_are_safe(rows)


# ---- config ------------------------------------------------------------------------------


def _known_fields() -> dict[str, list[str]]:
    return {
        name: list(f.annotation.model_fields)  # type: ignore[union-attr]
        for name, f in Config.model_fields.items()
    }


SECTIONS = _known_fields()
yaml_scalar = st.one_of(
    leaf,
    st.sampled_from(
        [
            "notaurl",
            "http://user:pw@127.0.0.1:8000/v1",
            "(unclosed",
            "x*",
            "a\x00b",
            "\ud800",
            "9" * 5000,
            "..",
            "a/b",
            "outputs",
        ]
    ),
)
yaml_value = st.recursive(
    yaml_scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def config_dict(draw: st.DrawFn) -> dict:
    """A config with known sections and fields (plus the odd unknown one), any values."""
    out: dict = {}
    for section in draw(st.lists(st.sampled_from([*SECTIONS, "bogus"]), max_size=4)):
        fields = SECTIONS.get(section, ["x"])
        names = draw(st.lists(st.sampled_from([*fields, "typo"]), max_size=3))
        out[section] = {n: draw(yaml_value) for n in names}
    return out


# hand-written YAML the dumper never produces: tags, anchors, odd escapes, huge numbers
ODD_YAML = [
    "run: {name: !!binary aGVsbG8=}",
    "backend: {vllm: {engine_args: {x: !!binary /w==}}}",
    "backend: {vllm: {engine_args: {x: !!set {a, b}}}}",
    "backend: {vllm: {engine_args: {x: 2024-01-01}}}",
    "run: {seed: " + "9" * 5000 + "}",
    "run: {seed: 0x" + "f" * 100 + "}",
    'run: {name: "\\ud800"}',
    'run: {name: "a\\0b"}',
    "a: &a [*a]",
    "x: " + "[" * 5000 + "]" * 5000,
    "run: !!python/object:os.system {}",
    "- just\n- a list",
    "pairs: {meta_patterns: ['(?P<x>a)(?P<x>b)']}",
    "pairs: {refusal_patterns: ['" + "(" * 200 + "a" + ")" * 200 + "']}",
]


# ten levels of ten aliases: a few lines that expand to 10^7 values
ALIAS_BOMB = "\n".join(
    [f"l0: &l0 [{', '.join(['x'] * 10)}]"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 7)]
    + ["backend: {vllm: {engine_args: {x: *l6}}}"]
)
ODD_YAML += [
    "backend: {vllm: {engine_args: {x: &a [*a]}}}",
    ALIAS_BOMB,
    "run: {name: 2024-01-01}",
    "backend: {vllm: {engine_args: {1: 2}}}",
    "input: {columns: {question: !!binary aGVsbG8=}}",
]


@pytest.mark.parametrize("text", ODD_YAML)
def test_odd_yaml_raises_only_pipeline_errors(scratch: Path, text: str) -> None:
    """Every hand-written case, not only those hypothesis happens to draw."""
    _load_and_round_trip(scratch, text.encode(), [])


def _load_and_round_trip(scratch: Path, data: bytes, overrides: list[str]) -> None:
    path = scratch / "config.yaml"
    path.write_bytes(data)
    try:
        cfg = load_config(path, overrides)
    except PipelineError as exc:
        assert "Traceback" not in str(exc)
        return
    # what loads must write a run.yaml that loads again to the same settings
    again = scratch / "run.yaml"
    again.write_text(cfg.to_yaml(), encoding="utf-8")
    reloaded = load_config(again)
    assert reloaded.to_yaml() == cfg.to_yaml()


@st.composite
def config_text(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["dict", "dict", "odd", "text", "bytes", "cut"]))
    if kind == "odd":
        return draw(st.sampled_from(ODD_YAML)).encode()
    if kind == "text":
        return draw(st.text(max_size=80)).encode("utf-8", "surrogatepass")
    if kind == "bytes":
        return draw(st.binary(max_size=80))
    text = yaml.safe_dump(draw(config_dict()), allow_unicode=draw(st.booleans()))
    if kind == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    return text.encode("utf-8", "surrogatepass")


override = st.one_of(
    st.text(max_size=20),
    st.builds(
        lambda s, f, v: f"{s}.{f}={v}",
        st.sampled_from(list(SECTIONS)),
        st.text(max_size=10),
        st.text(max_size=10),
    ),
)


@FUZZ
@given(data=config_text(), overrides=st.lists(override, max_size=2))
def test_config_raises_only_pipeline_errors(scratch: Path, data: bytes, overrides: list[str]):
    _load_and_round_trip(scratch, data, overrides)


# ---- pairs files (the audit) ---------------------------------------------------------------

WORDS = st.text(alphabet=st.sampled_from("ab cd ef\u00e9\n"), max_size=40)
DIMS = ("correctness", "relevance", "helpfulness")


def _maybe(plausible: st.SearchStrategy, odds: int = 8) -> st.SearchStrategy:
    """A value of the right shape, or one time in ``odds`` anything at all."""
    return st.integers(1, odds).flatmap(lambda k: json_value if k == 1 else plausible)


quality = st.fixed_dictionaries({d: _maybe(st.integers(1, 5)) for d in DIMS})
verdicts = st.fixed_dictionaries(
    {},
    optional={
        o: _maybe(st.sampled_from(["chosen", "rejected", "tie", None])) for o in ("AB", "BA")
    },
)
# a row in the reference schema with judge columns; any field may have the wrong type
audit_row = st.fixed_dictionaries(
    {
        "id": _maybe(st.text(min_size=1, max_size=6), 40),
        "question": _maybe(WORDS, 40),
        "chosen": _maybe(WORDS, 40),
        "rejected": _maybe(WORDS, 40),
    },
    optional={
        "category": _maybe(st.sampled_from(["A", "B", None])),
        "profile": _maybe(
            st.lists(st.fixed_dictionaries({"id": st.text(max_size=3), "text": WORDS}))
        ),
        "rubric_aspects": _maybe(
            st.lists(st.fixed_dictionaries({"aspect": WORDS, "evidence": WORDS, "reason": WORDS}))
        ),
        "narrative": _maybe(st.none() | WORDS),
        "quality_chosen": _maybe(quality),
        "quality_rejected": _maybe(quality),
        "coverage_chosen_mean": _maybe(st.floats(0, 2)),
        "coverage_rejected_mean": _maybe(st.floats(0, 2)),
        "pairwise_aware": _maybe(verdicts),
        "pairwise_blind": _maybe(verdicts),
        "human_verdict": _maybe(st.sampled_from(["chosen", "rejected", "tie", None])),
        "human_agreement": _maybe(st.floats(0, 1) | st.none()),
        "strategy": _maybe(st.sampled_from(["avoid_all", "violate_one", "other_user"])),
    },
)


@st.composite
def pairs_file(draw: st.DrawFn) -> bytes:
    """Mostly whole files of rows (so the figures get computed), sometimes damaged lines."""
    if draw(st.integers(0, 3)) == 0:
        return draw(jsonl_file(audit_row))
    rows = draw(st.lists(audit_row, min_size=1, max_size=12))
    return b"".join(json.dumps(r, allow_nan=True).encode() + b"\n" for r in rows)


@AUDIT_FUZZ
@given(data=pairs_file())
def test_audit_raises_only_pipeline_errors(scratch: Path, data: bytes) -> None:
    from pipeline.audit import compute_figures, load_pairs

    path = scratch / "pairs.jsonl"
    path.write_bytes(data)
    try:
        rows, source = load_pairs(path)
        figures = compute_figures(rows, source)
    except PipelineError:
        return
    json.dumps(figures)  # the figures are written as audit.json


# ---- annotate import ---------------------------------------------------------------------

choice_value = _maybe(st.sampled_from(["A", "B", "tie", "both bad", " a ", "Skip"]), 6)


def _control(name: str, key: str, value: st.SearchStrategy) -> st.SearchStrategy:
    """One result item of the labeling config's control ``name``, either part junk."""
    return st.fixed_dictionaries(
        {
            "from_name": _maybe(st.just(name), 12),
            "value": _maybe(st.fixed_dictionaries({key: value}), 12),
        }
    )


choice_item = _control(
    "choice", "choices", _maybe(st.lists(choice_value, min_size=1, max_size=2), 12)
)
result_item = _maybe(
    st.one_of(
        choice_item,
        _control("flags", "choices", _maybe(st.lists(st.sampled_from(["rubric unclear", "x"])))),
        _control("confidence", "rating", _maybe(st.integers(0, 6))),
        _control("comment", "text", _maybe(st.text(max_size=10) | st.lists(st.text(max_size=5)))),
    ),
    12,
)
ls_annotation = st.fixed_dictionaries(
    # a vote is a choice item first, then any others
    {
        "result": _maybe(
            st.builds(lambda c, rest: [c, *rest], choice_item, st.lists(result_item, max_size=2)),
            12,
        )
    },
    optional={
        "id": _maybe(st.integers(1, 50), 12),
        "completed_by": _maybe(
            st.integers(1, 3) | st.fixed_dictionaries({"id": st.integers(1, 3)}), 12
        ),
        "was_cancelled": _maybe(st.booleans(), 12),
        "updated_at": _maybe(st.sampled_from(["2026-01-01", "2026-01-02"]), 12),
    },
)


@st.composite
def ls_export(draw: st.DrawFn, keys: list[str]) -> bytes:
    """A Label Studio JSON export of the round's tasks: mostly the right shape, with any
    field of any type, sometimes a body that is not a list of tasks at all."""
    kind = draw(st.sampled_from(["tasks"] * 6 + ["truncated", "scalar", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=80))
    if kind == "scalar":
        return json.dumps(draw(json_value), allow_nan=True).encode()
    data = _maybe(
        _maybe(
            st.sampled_from(keys).map(lambda k: {"task_key": k, "pair_id": "p", "gold": False}),
            6,
        ).map(lambda d: d if isinstance(d, dict) else {"task_key": d}),
        8,
    )
    task = st.fixed_dictionaries(
        {
            "id": _maybe(st.integers(1, 20), 12),
            "data": _maybe(data, 12),
            "annotations": _maybe(st.lists(ls_annotation, max_size=3), 12),
        },
    )
    text = json.dumps(draw(st.lists(_maybe(task, 20), max_size=6)), allow_nan=True)
    if kind == "truncated":
        text = text[: draw(st.integers(0, max(0, len(text) - 1)))]
    return text.encode()


@pytest.fixture(scope="module")
def exported_round(scratch: Path) -> tuple[Config, Path, list[str]]:
    """A SYNTHETIC run with round 1 exported to a file (tests/test_annotate_tasks.py)."""
    import test_annotate_tasks as synth

    from pipeline.annotate.export import export_round

    run_dir = scratch / "synthetic"
    synth.make_synthetic_run(run_dir, 30)
    cfg = synth.make_config(scratch, sample_size=8, gold_tasks=2)
    export_round(cfg, run_dir, 1, file_only=True)
    tasks = json.loads((run_dir / "annotate" / "round-1" / "tasks.json").read_text())
    return cfg, run_dir, [t["data"]["task_key"] for t in tasks]


@IMPORT_FUZZ
@given(data=st.data())
def test_annotate_import_raises_only_pipeline_errors(exported_round, data) -> None:
    from pipeline.annotate.importer import import_round

    cfg, run_dir, keys = exported_round
    path = run_dir.parent / "export.json"
    path.write_bytes(data.draw(ls_export(keys)))
    try:
        # each example on its own: --replace, so no earlier example's votes are merged in
        summary = import_round(cfg, run_dir, 1, export_file=path, replace=True)
    except PipelineError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
        event("refused")
        return
    # --hypothesis-show-statistics shows how often votes got through
    event(f"votes: {summary['votes'] > 0}, skipped: {bool(summary['skipped'])}")
    # what was imported was written, and every vote is one of the four labels
    out = run_dir / "annotate" / "round-1"
    rows = [json.loads(x) for x in (out / "annotations.jsonl").read_text().splitlines()]
    # one vote per task and annotator whose labelled rows agree (copies of a task pooled)
    labelled: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        if r["label"] is not None:
            labelled.setdefault((r["task_key"], r["annotator"]), set()).add(r["label"])
    assert summary["votes"] == sum(len(v) == 1 for v in labelled.values())
    assert {r["label"] for r in rows} <= {None, "chosen", "rejected", "tie", "both_bad"}
    json.dumps(json.loads((out / "agreement.json").read_text()), allow_nan=False)
