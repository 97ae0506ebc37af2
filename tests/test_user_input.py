"""What a user types is checked where it enters, never crashes, hangs or passes silently.

The cases an adversarial tester found (issue 20): numbers without a sane bound, a YAML key
given twice, an input path that is a named pipe or a device, text made only of invisible
characters, two source columns read as one field, and credentials a server refuses. Each
runs the real entry point (``pipeline.cli.main``) and checks a non-zero exit, one
``error:`` line that names the file, line or field and the next step, no traceback, and
that nothing under the test's folder was created, changed or deleted. Inputs are written
by hand for the test.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, SAMPLE, disk_state, write_config
from pydantic import BaseModel
from standin_server import StandinServer
from test_errors import one_error_line

from pipeline.backends.openai.backend import OpenAIBackend
from pipeline.cli import main
from pipeline.config import BackendSection, Config
from pipeline.core.fields import visible_text
from pipeline.types.chat import ChatRequest, ChatResult

ROW = {"id": "q1", "question": "How do I start?", "profile": [{"id": "p1", "text": "I paint."}]}


def refused(capsys, tmp_path: Path, argv: list[str]) -> str:
    """Run ``prb argv``; assert one error line, no traceback and no change under tmp_path."""
    before = disk_state(tmp_path)
    line = one_error_line(capsys, argv)
    assert disk_state(tmp_path) == before
    return line


# ---- numbers: bounded and finite -------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "field", "words"),
    [
        ("backend.openai.max_concurrency=20000000", "backend.openai.max_concurrency",
         "or equal to 1024"),
        ("backend.openai.timeout_s=.inf", "backend.openai.timeout_s", "finite number"),
        ("backend.openai.timeout_s=.nan", "backend.openai.timeout_s", "finite number"),
        ("backend.openai.timeout_s=86400", "backend.openai.timeout_s",
         "less than or equal to 3600"),
        ("pairs.length_slack=-.inf", "pairs.length_slack", "finite number"),
        ("responses.n=1000000000", "responses.n", "less than or equal to 100"),
        ("backend.ray.result_timeout_s=0", "backend.ray.result_timeout_s", "greater than 0"),
    ],
)  # fmt: skip
def test_numbers_are_bounded_and_finite(tmp_path, capsys, override, field, words):
    cfg = write_config(tmp_path)
    for argv in (["config", "show", str(cfg)], ["run", str(cfg), "--no-progress"]):
        line = refused(capsys, tmp_path, [*argv, "--set", override])
        assert f"field '{field}'" in line and words in line, line


def test_infinite_timeout_in_the_file_names_the_field(tmp_path, capsys):
    cfg = write_config(tmp_path, backend={"timeout_s": float("inf")})
    assert ".inf" in cfg.read_text()  # yaml writes it as .inf, as a user would
    line = refused(capsys, tmp_path, ["run", str(cfg), "--no-progress"])
    assert str(cfg) in line and "field 'backend.openai.timeout_s'" in line and "finite" in line


def test_every_number_in_the_config_has_an_upper_bound_in_its_description():
    """Each int and float field declares le= (or lt=); `prb config fields` shows it."""
    from pipeline.config import describe_fields

    unbounded = []

    def walk(model: type, prefix: str) -> None:
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
                continue
            types = getattr(ann, "__args__", (ann,))
            numeric = any(t in (int, float) for t in types)
            bounded = any(hasattr(m, "le") or hasattr(m, "lt") for m in f.metadata)
            if numeric and not bounded and f"{prefix}{name}" != "run.seed":
                unbounded.append(f"{prefix}{name}")

    walk(Config, "")
    assert unbounded == []
    described = {name: desc for name, _, desc in describe_fields()}
    assert described["backend.openai.max_concurrency"].endswith("(1 to 1,024)")
    assert described["backend.openai.timeout_s"].endswith("(more than 0, at most 3,600)")


# ---- YAML: a key given twice -------------------------------------------------------------


def test_a_key_given_twice_names_the_second_line(tmp_path, capsys):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "run:\n  name: t\n  output_dir: out\n"
        "responses:\n  n: 4\n"  # line 4: the first block, which YAML would drop
        "backend:\n  model: m\n"
        "responses:\n  n: 2\n"  # line 8
    )
    line = refused(capsys, tmp_path, ["run", str(cfg), "--no-progress"])
    assert f"{cfg}, line 8" in line and "key 'responses' appears twice" in line
    assert "first on line 4" in line and "merge the two or delete one" in line


def test_a_key_given_twice_deep_down_and_in_a_set_value(tmp_path, capsys):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("backend:\n  model: a\n  timeout_s: 5\n  model: b\n")
    line = refused(capsys, tmp_path, ["config", "show", str(cfg)])
    assert "line 4" in line and "key 'model' appears twice" in line
    ok = write_config(tmp_path)
    line = refused(
        capsys, tmp_path, ["config", "show", str(ok), "--set", "input.columns={a: x, a: y}"]
    )
    assert "--set" in line and "duplicate key 'a'" in line


def test_merge_keys_and_overrides_of_them_still_load(tmp_path, capsys):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        f"input: {{format: lamp, path: {SAMPLE}}}\n"
        "judge:\n  sampling: &s {temperature: 0.0, top_p: 1.0, max_tokens: 1024}\n"
        "rubrics:\n  sampling:\n    <<: *s\n    max_tokens: 2048\n"
    )
    assert main(["config", "show", str(cfg)]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["rubrics"]["sampling"] == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 2048}


# ---- paths that are not what they must be ---------------------------------------------------


def _fifo(tmp_path: Path, name: str = "input.jsonl") -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


def _returns_within(seconds: float, fn) -> object:
    """fn() in a thread; fail (instead of hanging the suite) if it does not return."""
    box: list = []

    def call() -> None:
        try:
            box.append(("value", fn()))
        except BaseException as exc:  # handed back to the caller's thread
            box.append(("raised", exc))

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"did not return within {seconds} s"
    how, what = box[0]
    if how == "raised":
        raise what
    return what


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_input_path_that_is_a_pipe_or_a_device(tmp_path, capsys, kind):
    path = _fifo(tmp_path) if kind == "fifo" else Path("/dev/zero")
    cfg = write_config(tmp_path, input={"format": "lamp", "path": str(path)})
    before = disk_state(tmp_path)
    rc = _returns_within(30, lambda: main(["run", str(cfg), "--no-progress"]))
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    what = "a named pipe" if kind == "fifo" else "a character device"
    assert f"field 'input.path': {path} is {what}, not a JSONL file" in line
    assert "point input.path at a JSONL file" in line
    assert disk_state(tmp_path) == before  # no run directory, no run.yaml


def test_generic_and_hf_paths_and_the_config_itself(tmp_path, capsys):
    pipe = _fifo(tmp_path, "users.jsonl")
    cfg = write_config(
        tmp_path,
        input={"format": "generic", "users_path": str(pipe), "questions_path": str(SAMPLE)},
    )
    line = refused(capsys, tmp_path, ["run", str(cfg), "--no-progress"])
    assert "field 'input.users_path'" in line and "is a named pipe" in line
    # an hf dataset folder with a pipe inside: datasets would read it forever
    folder = tmp_path / "ds"
    folder.mkdir()
    os.mkfifo(folder / "data-00000-of-00001.arrow")
    cfg = write_config(tmp_path, input={"format": "hf", "path": str(folder)})
    line = refused(capsys, tmp_path, ["run", str(cfg), "--no-progress"])
    assert "field 'input.path'" in line and "in the dataset folder is a named pipe" in line
    # the config file itself
    line = _returns_within(30, lambda: refused(capsys, tmp_path, ["config", "show", str(pipe)]))
    assert f"{pipe}: is a named pipe, not a file" in str(line)
    line = refused(capsys, tmp_path, ["config", "show", "/dev/zero"])
    assert "/dev/zero: is a character device, not a file" in line


def test_audit_of_a_pipe(tmp_path, capsys):
    pipe = _fifo(tmp_path, "pairs.jsonl")
    line = _returns_within(30, lambda: refused(capsys, tmp_path, ["audit", str(pipe)]))
    assert f"{pipe}: is a named pipe, not a pairs file or folder" in str(line)


def test_ingest_called_directly_refuses_a_pipe_too(tmp_path):
    from pipeline.config import InputSection
    from pipeline.core.errors import InputError
    from pipeline.inputs.ingest import load_examples

    pipe = _fifo(tmp_path)
    with pytest.raises(InputError, match="is a named pipe, not a JSONL file"):
        _returns_within(30, lambda: load_examples(InputSection(path=pipe)))


# ---- text that shows nothing -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("\u200b\u2060\ufeff", "text with nothing visible"),
        ("\x00\x01\x1f", "text with nothing visible"),
        ("\u3164 \u00a0\u2800", "text with nothing visible"),  # Hangul filler, nbsp, blank braille
        ("  \t ", "only whitespace"),
        ("", "an empty string"),
    ],
    ids=["zero_width", "control", "fillers", "whitespace", "empty"],
)
@pytest.mark.parametrize(
    ("field", "place"),
    [
        ("question", lambda row, t: row.update(question=t)),
        ("profile[0].text", lambda row, t: row["profile"][0].update(text=t)),
        ("rubric_aspects[0].aspect", lambda row, t: row.update(rubric_aspects=[{"aspect": t}])),
        ("id", lambda row, t: row.update(id=t)),
    ],
    ids=["question", "post", "aspect", "id"],
)
def test_text_fields_need_visible_text(tmp_path, capsys, text, what, field, place):
    row = json.loads(json.dumps(ROW))
    place(row, text)
    src = tmp_path / "input.jsonl"
    src.write_text(json.dumps(ROW | {"id": "q0"}) + "\n" + json.dumps(row) + "\n")
    cfg = write_config(tmp_path, input={"format": "lamp", "path": str(src)})
    line = refused(capsys, tmp_path, ["run", str(cfg), "--until", "ingest", "--no-progress"])
    assert f"{src}, line 2, field '{field}'" in line and f"got {what}" in line


def test_visible_text():
    assert visible_text("\u200bHow\u2060 do  I\tstart?\ufeff") == "How do I start?"
    assert visible_text("ｆｕｌｌ ｗｉｄｔｈ") == "full width"  # NFKC
    assert visible_text("caf\u0065\u0301") == "café"  # a combining mark is visible
    assert visible_text("\U000e0041\ufe0f\u034f") == ""  # tag, variation selector, CGJ
    assert visible_text("plain ascii") == "plain ascii"


# ---- two columns read as one field -----------------------------------------------------


def _parquet(path: Path, names: list[str], columns: list[list]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_arrays([pa.array(c) for c in columns], names=names), path)
    return path


def test_two_question_columns_are_refused(tmp_path, capsys):
    profile = [[{"id": "p1", "text": "I paint."}]]
    src = _parquet(
        tmp_path / "in.parquet",
        ["id", "question", "question", "profile"],
        [["q1"], ["the first question"], ["the second question"], profile],
    )
    cfg = write_config(tmp_path, input={"format": "hf", "path": str(src)})
    line = refused(capsys, tmp_path, ["run", str(cfg), "--until", "ingest", "--no-progress"])
    assert "has 2 columns named 'question'" in line and "drop or rename all but one" in line
    # mapped: the same through input.columns
    src2 = _parquet(
        tmp_path / "in2.parquet",
        ["id", "query", "query", "profile"],
        [["q1"], ["a"], ["b"], profile],
    )
    cfg = write_config(
        tmp_path, input={"format": "hf", "path": str(src2), "columns": {"question": "query"}}
    )
    line = refused(capsys, tmp_path, ["run", str(cfg), "--until", "ingest", "--no-progress"])
    assert "has 2 columns named 'query' (read for field 'question')" in line


def test_two_fields_mapped_onto_one_column_are_refused(tmp_path, capsys):
    src = _parquet(
        tmp_path / "in.parquet",
        ["id", "question", "profile"],
        [["q1"], ["How?"], [[{"id": "p1", "text": "I paint."}]]],
    )
    cfg = write_config(
        tmp_path, input={"format": "hf", "path": str(src), "columns": {"narrative": "question"}}
    )
    line = refused(capsys, tmp_path, ["run", str(cfg), "--until", "ingest", "--no-progress"])
    assert "fields 'question' and 'narrative' both read column 'question'" in line
    assert "field 'columns.narrative'" in line


# ---- credentials the server refuses, and credentials in the URL ---------------------------


KEY = "sk-test-key-for-the-auth-server-0001"


def test_a_refused_key_is_its_own_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-key-0000000000000000")
    with StandinServer(authorization=f"Bearer {KEY}") as server:
        cfg = write_config(tmp_path, server)
        line = one_error_line(capsys, ["run", str(cfg), "--no-progress"])
        assert server.request_count == 0  # refused by the probe, before any request
    assert "refused the API key in $OPENAI_API_KEY (HTTP 401" in line
    assert "set OPENAI_API_KEY to a key this server accepts" in line
    assert "looks down" not in line and "sk-wrong" not in line

    monkeypatch.delenv("OPENAI_API_KEY")
    with StandinServer(authorization=f"Bearer {KEY}") as server:
        cfg = write_config(tmp_path, server)
        line = one_error_line(capsys, ["run", str(cfg), "--no-progress"])
    assert "$OPENAI_API_KEY is not set" in line and "export OPENAI_API_KEY=<your key>" in line


def test_a_key_refused_on_the_requests_stops_the_stage_at_once(tmp_path, monkeypatch):
    """A server whose /models is open but whose chat endpoint refuses the key."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with StandinServer() as server:
        server.inject("401", 1000)
        cfg = BackendSection(base_url=server.base_url, max_concurrency=4, abort_after_failures=50)

        async def go() -> list:
            backend = OpenAIBackend(cfg)
            try:
                return [x async for x in backend.run([_request(i) for i in range(40)])]
            finally:
                await backend.aclose()

        from pipeline.core.errors import BackendError

        with pytest.raises(BackendError, match=r"refused the API key in \$OPENAI_API_KEY"):
            asyncio.run(go())
        assert server.request_count <= 4  # one per worker, not 40 (nor 50 failures)


def _request(i: int) -> ChatRequest:
    return ChatRequest(messages=(("user", f"question {i}"),), model="standin-model")


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_credentials_in_the_url_work_on_both_transports(transport, monkeypatch):
    """user:password@ goes as HTTP Basic auth, ?api-key= with every request."""
    import base64

    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # replaced by the URL's credentials
    basic = "Basic " + base64.b64encode(b"alice:s3cr3t pass").decode()
    with StandinServer(authorization=basic) as server:
        url = server.base_url.replace("http://", "http://alice:s3cr3t%20pass@") + "?api-key=k123"
        cfg = BackendSection(base_url=url, http_transport=transport)
        from pipeline.backends.openai.backend import check_reachable

        check_reachable(cfg.openai)  # the probe sends them too

        async def go() -> list:
            backend = OpenAIBackend(cfg)
            try:
                return [x async for x in backend.run([_request(i) for i in range(3)])]
            finally:
                await backend.aclose()

        results = asyncio.run(go())
        assert all(isinstance(r, ChatResult) for _, r in results)
        assert server.refused == 0
        assert [r["query"] for r in server.requests] == [{"api-key": "k123"}] * 3


def test_wrong_password_in_the_url_names_base_url(tmp_path, capsys):
    with StandinServer(authorization="Basic nobody-has-this") as server:
        url = server.base_url.replace("http://", "http://alice:wrong-pass@")
        cfg = write_config(tmp_path, server, backend={"base_url": url})
        line = one_error_line(capsys, ["run", str(cfg), "--no-progress"])
    assert "refused the user name and password in backend.openai.base_url (HTTP 401" in line
    assert "fix them in backend.openai.base_url" in line and "wrong-pass" not in line


# ---- CI prints the slowest tests ---------------------------------------------------------


def test_ci_prints_test_durations():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    pytest_lines = [ln for ln in lines if "-m pytest" in ln]
    # the suite without the llama.cpp tests, then those once the extra is built
    assert len(pytest_lines) == 2
    assert all("--durations=" in ln for ln in pytest_lines)
