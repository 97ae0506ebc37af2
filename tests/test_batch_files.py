"""Batch files (`prb batch export` / `prb batch import`, pipeline/batch/): the cluster loop
against a fake vLLM ``run_batch`` that answers each exported line with the stand-in
server's own answer and writes it in run_batch's output shape.

The shapes checked field by field are those of vLLM's run_batch (vllm/entrypoints/openai/
run_batch.py, 0.26: ``BatchRequestInput`` {custom_id, method, url, body};
``BatchRequestOutput`` {id, custom_id, response, error}; ``BatchResponseData``
{status_code, request_id, body}; an error as status_code >= 400 with ``error`` a message or
an ``ErrorResponse``) and of OpenAI's Batch API (the same request line; its output lines
``{"id": "batch_req_...", "custom_id", "response": {"status_code", "request_id", "body"},
"error": null}`` and its errors file ``{"response": null, "error": {"code", "message"}}``).
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import sqlite3
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import write_config

from pipeline.backends.openai.lines import CHAT_URL, read_results, request_line
from pipeline.cli import main
from pipeline.kinds.stages import ORDER
from pipeline.run import RunDir
from pipeline.run.cache import RequestCache
from pipeline.types.chat import ChatRequest

# BatchRequestInput (vLLM) / the request input object (OpenAI)
REQUEST_FIELDS = {"custom_id", "method", "url", "body"}
# BatchRequestOutput (vLLM) / the request output object (OpenAI)
OUTPUT_FIELDS = {"id", "custom_id", "response", "error"}
# BatchResponseData (vLLM) / response (OpenAI)
RESPONSE_FIELDS = {"status_code", "request_id", "body"}
# the chat-completions body the project sends; nothing of its own (served_by) goes out
BODY_FIELDS = {"model", "messages", "temperature", "top_p", "max_tokens", "n"}
BODY_OPTIONAL = {"seed", "response_format"}
GENERATED = {"rubrics": {"source": "generated"}}


def check_request_line(line: str) -> dict[str, Any]:
    """One exported line against the request shape run_batch and OpenAI read."""
    obj = json.loads(line)
    assert set(obj) == REQUEST_FIELDS, obj.keys()
    assert isinstance(obj["custom_id"], str) and re.fullmatch(r"[0-9a-f]{64}", obj["custom_id"])
    assert obj["method"] == "POST"
    assert obj["url"] == "/v1/chat/completions" == CHAT_URL
    body = obj["body"]
    assert BODY_FIELDS <= set(body) <= BODY_FIELDS | BODY_OPTIONAL, body.keys()
    assert isinstance(body["model"], str) and body["model"]
    assert body["messages"] and all(
        set(m) == {"role", "content"}
        and m["role"] in ("system", "user", "assistant")
        and isinstance(m["content"], str)
        for m in body["messages"]
    )
    assert isinstance(body["temperature"], float) and isinstance(body["top_p"], float)
    assert isinstance(body["max_tokens"], int) and body["max_tokens"] > 0
    assert isinstance(body["n"], int) and body["n"] >= 1
    assert "seed" not in body or isinstance(body["seed"], int)
    if "response_format" in body:
        fmt = body["response_format"]
        assert fmt["type"] == "json_schema" and set(fmt) == {"type", "json_schema"}
        assert set(fmt["json_schema"]) == {"name", "schema"}
        assert isinstance(fmt["json_schema"]["schema"], dict)
    return obj


def run_batch(server: Any, inp: Path, out: Path) -> int:
    """A stand-in for ``python -m vllm.entrypoints.openai.run_batch -i INP -o OUT``: every
    request line is answered by the stand-in server (its own HTTP answer, faults it was
    told to inject included) and written in run_batch's output shape, in input order.
    Returns the number of lines answered."""
    lines = []
    for text in inp.read_text(encoding="utf-8").splitlines():
        req = check_request_line(text)
        http = urllib.request.Request(
            server.base_url + "/chat/completions",
            data=json.dumps(req["body"]).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(http, timeout=60) as resp:
                status, reply = resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            status, reply = exc.code, json.loads(exc.read())
        ok = status == 200
        lines.append({
            "id": f"vllm-{uuid.uuid4().hex}",
            "custom_id": req["custom_id"],
            "response": {
                "status_code": status,
                "request_id": f"vllm-batch-{uuid.uuid4().hex}",
                "body": reply if ok else None,
            },
            # run_batch writes the engine's ErrorResponse here ({"error": {...}})
            "error": None if ok else reply,
        })  # fmt: skip
    out.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    for x in lines:
        assert set(x) == OUTPUT_FIELDS and set(x["response"]) == RESPONSE_FIELDS
    return len(lines)


def export(cfg: Path, out: Path, capsys: Any) -> tuple[int, str]:
    """`prb batch export`: (its exit status, what it printed)."""
    rc = main(["batch", "export", str(cfg), "-o", str(out), "--no-progress"])
    cap = capsys.readouterr()
    return rc, cap.out + cap.err


def import_(cfg: Path, capsys: Any, *files: Path) -> tuple[int, str, str]:
    """`prb batch import`: (its exit status, stdout, stderr)."""
    rc = main(["batch", "import", str(cfg), *map(str, files), "--no-progress"])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def cluster_loop(cfg: Path, server: Any, work: Path, capsys: Any) -> list[tuple[str, int]]:
    """Export, run_batch, import, until export has nothing to write; (stage, requests) of
    every round."""
    rounds: list[tuple[str, int]] = []
    for n in range(20):
        requests = work / f"requests-{n}.jsonl"
        rc, said = export(cfg, requests, capsys)
        assert rc == 0, said
        if not requests.exists():
            assert "every stage is done" in said
            return rounds
        stage = re.search(r"of stage '(\w+)'", said)
        assert stage, said
        results = work / f"results-{n}.jsonl"
        count = run_batch(server, requests, results)
        rounds.append((stage.group(1), count))
        rc, out, err = import_(cfg, capsys, results)
        assert rc == 0 and f"stored {count}; skipped 0" in out, out + err
    raise AssertionError(f"the loop did not end: {rounds}")


# the only fields in which a row of the batch run differs from the plain run's: the
# identity of what served (``served_by``, in a row's provenance, and in the pair rows'
# provenance of the generator and the judge) and ``request_key``, a cache key (it holds
# the identity's id, so that one backend's answer is never served as another's)
SERVED = ("served_by", "request_key")


def _content(row: Any) -> Any:
    """A row without the fields that name what served it."""
    if isinstance(row, dict):
        return {k: _content(v) for k, v in row.items() if k not in SERVED}
    if isinstance(row, list):
        return [_content(v) for v in row]
    return row


def test_the_cluster_loop_gives_the_rows_of_a_plain_run(tmp_path, server, capsys):
    """Export / run_batch / import, round after round, then `prb run`: the same requests
    reach the model as in a plain run against the stand-in with the same settings, and the
    rows are the same in every field but those that name what served them (SERVED). (The
    batchfile backend answers in rounds, so its judge asks every combination's pairwise
    verdicts in one round, judge.stop: all; the plain run is given the same setting.)"""
    plain = write_config(_dir(tmp_path / "plain"), server, judge={"stop": "all"}, **GENERATED)
    assert main(["run", str(plain), "--no-progress"]) == 0
    plain_bodies = Counter(json.dumps(r["body"], sort_keys=True) for r in server.requests)
    server.reset()

    cfg = write_config(_dir(tmp_path / "batch"), server, backend={"name": "batchfile"},
                       **GENERATED)  # fmt: skip
    capsys.readouterr()
    rounds = cluster_loop(cfg, server, tmp_path, capsys)
    # the stages that ask a model, each until its answers are in (the judge twice: its
    # pairwise verdicts are asked once the pointwise ones are in)
    assert [s for s, _ in rounds] == ["rubrics", "responses", "judge", "judge"], rounds
    # exactly the requests a plain run sends, each once: nothing but run_batch reached the
    # server (export and import contact nothing)
    batch_bodies = Counter(json.dumps(r["body"], sort_keys=True) for r in server.requests)
    assert batch_bodies == plain_bodies and sum(n for _, n in rounds) == len(server.requests)

    before = server.request_count
    assert main(["run", str(cfg), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert all(f"[{s}] done, nothing to do" in err for s in ORDER), err
    assert server.request_count == before

    a, b = RunDir(tmp_path / "plain/outputs/t"), RunDir(tmp_path / "batch/outputs/t")
    for stage in ORDER:
        rows_a = sorted(a.stage(stage).rows(), key=json.dumps)
        rows_b = sorted(b.stage(stage).rows(), key=json.dumps)
        assert len(rows_a) == len(rows_b) > 0, stage
        by_id = {json.dumps(_content(r), sort_keys=True) for r in rows_a}
        assert by_id == {json.dumps(_content(r), sort_keys=True) for r in rows_b}, stage
    # what differs is what served: the stand-in says it is no model, the batch identity
    # names the model its result lines were checked against
    row = next(b.stage("responses").rows())
    assert row["provenance"]["served_by"]["kind"] == "batchfile"
    assert row["provenance"]["served_by"]["models"] == ["standin-model"]
    assert next(a.stage("responses").rows())["provenance"]["served_by"]["kind"] == "stand-in"


def _dir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def test_export_writes_what_plan_counts_and_contacts_no_server(
    tmp_path, server, capsys, monkeypatch
):
    cfg = write_config(tmp_path, server, backend={"name": "batchfile"}, **GENERATED)
    contacted: list[Any] = []

    def no_network(sock: socket.socket, address: Any) -> None:
        contacted.append(address)  # not /models, not a chat request: nothing at all
        raise OSError("this test allows no connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    assert main(["plan", str(cfg), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    first = next(s for s in plan["stages"] if s["to_send"]["requests"])
    rc, said = export(cfg, tmp_path / "r.jsonl", capsys)
    assert rc == 0 and f"of stage '{first['stage']}'" in said
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert len(lines) == first["to_send"]["requests"] == 12
    assert len({check_request_line(x)["custom_id"] for x in lines}) == 12
    assert server.request_count == 0
    # what waits is recorded as asked; `prb run` says in one line how to go on
    assert main(["run", str(cfg), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: stage 'rubrics': 12 of 12 requests have no answer yet")
    assert "Traceback" not in err
    # the export it suggests is the command to type: this run's config and --set options
    (suggested,) = [c for c in re.findall(r"`([^`]+)`", err) if c.startswith("prb batch export")]
    assert suggested == f"prb batch export {cfg}"
    assert main([*shlex.split(suggested)[1:], "--no-progress"]) == 0
    (written,) = RunDir(tmp_path / "outputs/t").batch_dir.glob("requests-rubrics-*.jsonl")
    assert written.read_text().splitlines() == lines
    assert server.request_count == 0
    # a second export of the same run writes the same requests again (nothing answered)
    rc, _ = export(cfg, tmp_path / "again.jsonl", capsys)
    assert (tmp_path / "again.jsonl").read_text().splitlines() == lines
    assert contacted == []


def _answer_line(custom_id: str, content: str, model: str = "standin-model", **kw: Any) -> str:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": kw.pop("finish", "stop"),
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    line = {
        "id": kw.pop("line_id", f"vllm-{uuid.uuid4().hex}"),
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": "vllm-batch-1", "body": body},
        "error": None,
    }
    return json.dumps(line)


def test_bad_lines_are_named_and_skipped_and_nothing_of_them_is_cached(tmp_path, server, capsys):
    cfg = write_config(tmp_path, server, backend={"name": "batchfile"}, **GENERATED)
    export(cfg, tmp_path / "r.jsonl", capsys)
    run_batch(server, tmp_path / "r.jsonl", tmp_path / "good.jsonl")
    good = [json.loads(x) for x in (tmp_path / "good.jsonl").read_text().splitlines()]
    ids = [g["custom_id"] for g in good]
    stranger = "0" * 64
    bad = [
        json.dumps(good[0]),  # 1: a good answer: stored
        _answer_line(stranger, "{}"),  # 2: never asked
        '{"id": "vllm-x", "custom_id": "',  # 3: cut short
        _answer_line(ids[0], '{"aspects": []}'),  # 4: a second line for ids[0]
        json.dumps({"id": "vllm-e", "custom_id": ids[1],  # 5: vLLM's error line
                    "response": {"status_code": 500, "request_id": "vllm-batch-e",
                                 "body": None},
                    "error": {"error": {"message": "engine died", "type": "InternalError",
                                        "code": 500}}}),
        _answer_line(ids[2], good[2]["response"]["body"]["choices"][0]["message"]["content"],
                     model="another-model"),  # 6: another model answered
        json.dumps({"id": "batch_req_4", "custom_id": ids[3], "response": None,  # 7: OpenAI
                    "error": {"code": "batch_expired", "message": "not run in time"}}),
        _answer_line(ids[4], "{", finish=None),  # 8: no finish reason: not finished
        "",  # blank lines are passed over
        "[1, 2]",  # 10: not an object
    ]  # fmt: skip
    results = tmp_path / "results.jsonl"
    results.write_text("\n".join(bad) + "\n", encoding="utf-8")
    rc, out, err = import_(cfg, capsys, results)
    assert rc == 0
    assert f"imported {results}: 9 lines; stored 1; skipped 8 (" in out, out
    for code, n in [("broken line", 2), ("not asked", 1), ("duplicate", 1), ("error", 2),
                    ("other model", 1), ("unfinished", 1)]:  # fmt: skip
        assert f"{n} {code}" in out, (code, out)
    assert f"{results}:2: custom_id {stranger} was not asked by this run" in err
    assert f"{results}:3: not a JSON line" in err
    assert f"{results}:4: custom_id {ids[0]} appears again (first on line 1)" in err
    assert f"{results}:5: the request failed in the batch (HTTP 500: 500: engine died)" in err
    assert f"{results}:6: answered by model another-model, but the request asked for " \
           "standin-model" in err  # fmt: skip
    assert f"{results}:7: the request failed in the batch (batch_expired: not run in time)" in err
    assert f"{results}:8: choice 0 has finish_reason null" in err
    assert f"{results}:10: not a JSON object" in err
    assert "12 requests" not in out
    with RequestCache(RunDir(tmp_path / "outputs/t").cache_path, readonly=True) as cache:
        assert cache.present([*ids, stranger]) == {ids[0]}
    state = sqlite3.connect(RunDir(tmp_path / "outputs/t").batch_state)
    assert [k for (k,) in state.execute("SELECT key FROM answers")] == [ids[0]]
    state.close()

    # the requests of the failed lines go out again in the next export; the stored one not
    rc, said = export(cfg, tmp_path / "next.jsonl", capsys)
    assert rc == 0, said
    again = [json.loads(x)["custom_id"] for x in (tmp_path / "next.jsonl").read_text().splitlines()]
    assert sorted(again) == sorted(ids[1:]) and stranger not in again

    # importing the same file again is harmless: every line with an id was read before
    rc, out, err = import_(cfg, capsys, results)
    assert rc == 0 and "stored 0; skipped 9 (7 already imported, 2 broken line)" in out, out
    with RequestCache(RunDir(tmp_path / "outputs/t").cache_path, readonly=True) as cache:
        assert cache.present([*ids, stranger]) == {ids[0]} and cache.count() == 1


def test_the_whole_results_file_again_is_harmless(tmp_path, server, capsys):
    """A results file imported twice (and with a later file beside it): nothing stored
    twice, the run goes on as with one import."""
    cfg = write_config(tmp_path, server, backend={"name": "batchfile"}, **GENERATED)
    export(cfg, tmp_path / "r.jsonl", capsys)
    run_batch(server, tmp_path / "r.jsonl", tmp_path / "res.jsonl")
    rc, out, _ = import_(cfg, capsys, tmp_path / "res.jsonl")
    assert "stored 12; skipped 0" in out
    cache = RunDir(tmp_path / "outputs/t").cache_path
    with RequestCache(cache, readonly=True) as c:
        stored = c.count()
    rc, out, _ = import_(cfg, capsys, tmp_path / "res.jsonl", tmp_path / "res.jsonl")
    assert rc == 0 and "stored 0; skipped 24 (24 already imported)" in out, out
    with RequestCache(cache, readonly=True) as c:
        assert c.count() == stored == 12


def test_an_invalid_answer_is_re_asked_in_the_next_export(tmp_path, server, capsys):
    """An answer that does not validate is not cached: the runner builds its re-ask, which
    goes out in the next export, as it would go to a server."""
    cfg = write_config(tmp_path, server, backend={"name": "batchfile"}, **GENERATED)
    export(cfg, tmp_path / "r.jsonl", capsys)
    first = check_request_line((tmp_path / "r.jsonl").read_text().splitlines()[0])
    server.inject("bad_json", 1)  # the first line's answer is cut-off JSON
    run_batch(server, tmp_path / "r.jsonl", tmp_path / "res.jsonl")
    rc, out, _ = import_(cfg, capsys, tmp_path / "res.jsonl")
    assert "stored 11; skipped 0; 1 invalid answers (re-asked in the next export)" in out, out
    with RequestCache(RunDir(tmp_path / "outputs/t").cache_path, readonly=True) as c:
        assert first["custom_id"] not in c.present([first["custom_id"]])
    export(cfg, tmp_path / "r2.jsonl", capsys)
    (line,) = (tmp_path / "r2.jsonl").read_text().splitlines()
    reask = check_request_line(line)["body"]["messages"]
    assert reask[: len(first["body"]["messages"])] == first["body"]["messages"]
    assert reask[-2] == {"role": "assistant", "content": '{"aspects": ['}
    assert reask[-1]["content"].startswith("Your previous answer could not be used")
    run_batch(server, tmp_path / "r2.jsonl", tmp_path / "res2.jsonl")
    rc, out, _ = import_(cfg, capsys, tmp_path / "res2.jsonl")
    assert rc == 0 and "stored 1; skipped 0" in out and "of stage 'responses' wait" in out, out


def test_batch_commands_refuse_in_one_line(tmp_path, server, capsys):
    live = write_config(tmp_path, server)
    assert main(["batch", "export", str(live)]) == 1
    err = capsys.readouterr().err
    assert "needs backend.name batchfile" in err and "--set backend.name=batchfile" in err
    assert not (tmp_path / "outputs").exists()
    cfg = str(live)
    assert main(["batch", "import", cfg, "x.jsonl", "--set", "backend.name=batchfile"]) == 1
    err = capsys.readouterr().err
    assert "nothing was exported" in err and "prb batch export CONFIG" in err
    assert main(["batch", "export", cfg, "--set", "backend.name=batchfile", "--no-progress"]) == 0
    capsys.readouterr()
    missing = tmp_path / "missing.jsonl"
    assert main(["batch", "import", cfg, str(missing), "--set", "backend.name=batchfile"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {missing}: cannot be read") and "Traceback" not in err
    assert server.request_count == 0


def test_export_replaces_only_an_earlier_export(tmp_path, server, capsys):
    """-o names a user's file: refused before any stage runs, the file as it was; a folder
    or a missing folder too. An earlier export at that path is replaced."""
    cfg = write_config(tmp_path, server, backend={"name": "batchfile"})
    mine = tmp_path / "notes.jsonl"
    mine.write_text('{"mine": 1}\n', encoding="utf-8")
    rc, said = export(cfg, mine, capsys)
    assert rc == 1 and f"error: {mine}, field '-o': is a file `prb batch export` did not" in said
    assert mine.read_text(encoding="utf-8") == '{"mine": 1}\n'
    assert not (tmp_path / "outputs").exists(), "a stage ran before the refusal"
    rc, said = export(cfg, tmp_path, capsys)
    assert rc == 1 and "is a folder, not a file" in said
    rc, said = export(cfg, tmp_path / "no" / "such.jsonl", capsys)
    assert rc == 1 and "does not exist" in said
    assert "Traceback" not in said
    out = tmp_path / "requests.jsonl"
    assert export(cfg, out, capsys)[0] == 0
    first = out.read_text(encoding="utf-8")
    assert first and all(check_request_line(x) for x in first.splitlines())
    assert export(cfg, out, capsys)[0] == 0  # an earlier export: replaced, with the same lines
    assert out.read_text(encoding="utf-8") == first
    assert server.request_count == 0


# ---- the format itself (pipeline/backends/openai/lines.py) ---------------------------


def _req(model: str = "gpt-4o-mini", n: int = 1) -> ChatRequest:
    return ChatRequest(messages=(("user", "Say hello."),), model=model, n=n, max_tokens=16)


def test_request_line_is_the_documented_request_shape():
    req = _req()
    line = request_line(req, req.openai_body())
    check_request_line(json.dumps(line))
    assert line["custom_id"] == req.key and line["body"] == req.openai_body()


def test_results_in_the_shapes_openai_and_vllm_document():
    """OpenAI's documented output and errors-file lines, and vLLM's error lines (a message
    string, an ErrorResponse), read field by field."""
    req = _req()
    ok = {"id": "batch_req_123", "custom_id": "request-2",
          "response": {"status_code": 200, "request_id": "req_123",
                       "body": {"id": "chatcmpl-123", "object": "chat.completion",
                                "created": 1711652795, "model": "gpt-4o-mini",
                                "choices": [{"index": 0, "message": {"role": "assistant",
                                                                     "content": "Hello."},
                                             "logprobs": None, "finish_reason": "stop"}],
                                "usage": {"prompt_tokens": 22, "completion_tokens": 2,
                                          "total_tokens": 24},
                                "system_fingerprint": "fp_123"}},
          "error": None}  # fmt: skip
    openai_error = {"id": "batch_req_456", "custom_id": "request-3", "response": None,
                    "error": {"code": "invalid_request", "message": "bad model"}}  # fmt: skip
    vllm_text = {"id": "vllm-1", "custom_id": "request-4",
                 "response": {"status_code": 400, "request_id": "vllm-batch-1", "body": None},
                 "error": "Request must not be sent in stream mode"}  # fmt: skip
    vllm_object = {"id": "vllm-2", "custom_id": "request-5",
                   "response": {"status_code": 404, "request_id": "vllm-batch-2", "body": None},
                   "error": {"error": {"message": "The model `x` does not exist.",
                                       "type": "NotFoundError", "param": None,
                                       "code": 404}}}  # fmt: skip
    expected = {f"request-{i}": req for i in range(2, 6)}
    lines = [json.dumps(x).encode() for x in (ok, openai_error, vllm_text, vllm_object)]
    got = list(read_results(lines, expected, source="out.jsonl"))
    assert got[0].result is not None and got[0].line_id == "batch_req_123"
    assert got[0].custom_id == "request-2" and got[0].where == "out.jsonl:1"
    r = got[0].result
    assert [(c.text, c.finish_reason) for c in r.choices] == [("Hello.", "stop")]
    assert (r.prompt_tokens, r.completion_tokens, r.model) == (22, 2, "gpt-4o-mini")
    assert got[1].failed and got[1].message == (
        "out.jsonl:2: the request failed in the batch (invalid_request: bad model)"
    )
    assert got[2].failed and got[2].why == (
        "the request failed in the batch (HTTP 400: Request must not be sent in stream mode)"
    )
    assert got[3].failed and got[3].code == "error" and "NotFoundError" not in got[3].why
    assert "404: The model `x` does not exist." in got[3].why
    # a reply of n answers to a request of n=2 with one: not an answer
    two = {**ok, "custom_id": "request-9"}
    (p,) = read_results([json.dumps(two)], {"request-9": _req(n=2)}, source="s")
    assert p.failed and p.code == "wrong n"


def test_the_live_backend_and_batch_results_read_replies_with_one_function():
    import inspect

    from pipeline.backends.openai import backend, lines, wire

    assert lines.parse_reply is wire.parse_reply is backend.parse_reply
    # the live path reads each reply in _post (its _once builds the bodies per dialect)
    assert "parse_reply(" in inspect.getsource(backend.OpenAIBackend._post)


def test_a_request_line_given_as_a_result_is_named():
    req = _req()
    (p,) = read_results([json.dumps(request_line(req, req.openai_body()))], {req.key: req},
                        source="requests.jsonl")  # fmt: skip
    assert p.failed and p.code == "request line" and p.result is None
    assert p.message == (
        "requests.jsonl:1: a request line, not a result: import what the runner wrote"
    )


@pytest.mark.parametrize("junk", [b"\xff\xfe", b"null", b'{"custom_id": 7}'])
def test_junk_lines_are_skipped_with_their_place(junk):
    (p,) = read_results([junk], {}, source="f")
    assert p.skipped and p.code == "broken line" and p.message.startswith("f:1: ")


def test_a_request_given_up_on_is_asked_afresh_in_the_next_export(tmp_path, server, capsys):
    """Still invalid after backend.max_reasks re-asks: as a live run records the failure
    and sends the request again on the next run, the next export asks it again (its
    imported answers are set aside); a valid answer then finishes the stage."""
    cfg = write_config(tmp_path, server, backend={"name": "batchfile", "max_reasks": 1},
                       **GENERATED)  # fmt: skip
    export(cfg, tmp_path / "r0.jsonl", capsys)
    first = check_request_line((tmp_path / "r0.jsonl").read_text().splitlines()[0])
    asked = first["body"]["messages"]
    # the first answer and its one re-ask come back as cut-off JSON
    server.inject("bad_json", 2, match=lambda body: body["messages"][: len(asked)] == asked)
    sizes = []
    for n in range(1, 4):
        run_batch(server, tmp_path / f"r{n - 1}.jsonl", tmp_path / f"res{n}.jsonl")
        rc, out, err = import_(cfg, capsys, tmp_path / f"res{n}.jsonl")
        assert rc == 0, out + err
        rc, said = export(cfg, tmp_path / f"r{n}.jsonl", capsys)
        lines = (tmp_path / f"r{n}.jsonl").read_text().splitlines()
        sizes.append((n, len(lines)))
        if n == 1:  # the re-ask of the invalid answer
            assert "1 invalid answers" in out and len(lines) == 1
            assert json.loads(lines[0])["custom_id"] != first["custom_id"]
        if n == 2:  # given up after its re-ask: the request itself, afresh
            assert "1 invalid answers" in out, out
            assert [json.loads(x)["custom_id"] for x in lines] == [first["custom_id"]]
        if n == 3:  # answered: the stage is done, the next one waits
            assert "stored 1; skipped 0" in out and "of stage 'responses'" in said, out
    with RequestCache(RunDir(tmp_path / "outputs/t").cache_path, readonly=True) as cache:
        assert cache.present([first["custom_id"]]) == {first["custom_id"]}
        failures = [e for e in cache.errors() if e["key"] == first["custom_id"]]
    assert len(failures) == 1 and failures[0]["reason"].startswith("invalid_json")
    assert sizes[:2] == [(1, 1), (2, 1)]


def test_an_export_never_undoes_what_another_backend_finished(tmp_path, server, capsys):
    """The README adds `--set backend.name=batchfile` to each command: on a run the stand-in
    finished, the export re-did every LLM stage (responses partial, 0 of 12) and staled the
    release. It is now refused in one line, with the two ways on, and nothing changes."""
    from conftest import disk_state

    cfg = str(write_config(tmp_path, server, input={"limit": 3}))
    assert main(["run", cfg, "--until", "responses", "--no-progress"]) == 0
    capsys.readouterr()
    before = disk_state(tmp_path / "outputs")
    argv = ["batch", "export", cfg, "--set", "backend.name=batchfile", "--no-progress"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    line = err[0]
    assert "`prb batch export` would re-do stage 'responses'" in line and "finished" in line
    assert "--set run.name=NAME" in line and "--redo responses" in line
    assert disk_state(tmp_path / "outputs") == before
    assert RunDir(tmp_path / "outputs" / "t").stage("responses").done


def test_a_line_nested_too_deeply_is_named_and_the_good_lines_stored(tmp_path, server, capsys):
    """A results line nested 100,000 levels deep made the whole import fail with a message
    naming neither file nor line, and the file's good lines were not stored."""
    cfg = write_config(tmp_path, server, backend={"name": "batchfile"}, **GENERATED)
    export(cfg, tmp_path / "r.jsonl", capsys)
    run_batch(server, tmp_path / "r.jsonl", tmp_path / "good.jsonl")
    first = (tmp_path / "good.jsonl").read_text().splitlines()[0]
    results = tmp_path / "results.jsonl"
    results.write_text(first + "\n" + "[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")
    rc, out, err = import_(cfg, capsys, results)
    assert rc == 0 and "stored 1; skipped 1 (1 broken line)" in out, out
    assert f"{results}:2: nested too deeply to be a result line" in err
    assert "Traceback" not in err


def test_a_broken_line_corrected_and_imported_again_is_stored(tmp_path, server, capsys):
    """A line that could not be read (its status_code not a number) was not imported: the
    same line corrected, in a later file, is stored, not refused as imported before; the
    lines that were read are refused as imported, as before."""
    cfg = write_config(tmp_path, server, backend={"name": "batchfile"}, **GENERATED)
    export(cfg, tmp_path / "r.jsonl", capsys)
    run_batch(server, tmp_path / "r.jsonl", tmp_path / "good.jsonl")
    lines = (tmp_path / "good.jsonl").read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    assert first.get("id")  # a line id, as runners write
    broken = {**first, "response": {**first["response"], "status_code": "abc"}}
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([json.dumps(broken), *lines[1:]]) + "\n", encoding="utf-8")
    rc, out, err = import_(cfg, capsys, bad)
    assert rc == 0 and f"stored {len(lines) - 1}; skipped 1 (1 broken line)" in out, out
    assert f"{bad}:1: response.status_code is not a number" in err
    rc, out, err = import_(cfg, capsys, tmp_path / "good.jsonl")
    assert rc == 0, err
    assert f"stored 1; skipped {len(lines) - 1} ({len(lines) - 1} already imported)" in out, out
    assert f"line id {first['id']} was imported before" not in err
