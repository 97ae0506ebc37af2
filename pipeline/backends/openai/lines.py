"""The OpenAI batch JSONL format: the request lines a batch file holds and the result lines
that come back, as vLLM's offline runner (``python -m vllm.entrypoints.openai.run_batch``)
and OpenAI's Batch API both write them. Shared by batch files (``prb batch``) and the Batch
API mode, so the two read and write one format.

A request line: ``{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}``;
``custom_id`` is the request's cache key (``ChatRequest.key``), so an answer finds its
request again whatever order the runner writes them in.

A result line: ``{"id", "custom_id", "response": {"status_code", "request_id", "body"},
"error"}``; ``body`` is the chat completion, read by the live backend's own reply parser
(:func:`pipeline.backends.openai.backend.parse_reply`). vLLM writes a failed request as
``response.status_code`` >= 400 with ``error`` holding a message or an error object;
OpenAI's errors file as ``response: null`` with ``error: {"code", "message"}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.backends.openai.wire import UnusableReply, parse_reply
from pipeline.core.redact import redact
from pipeline.types.chat import ChatRequest, ChatResult

CHAT_URL = "/v1/chat/completions"
# finish reasons of an answer that was stopped before the model finished it for a reason
# of the runner's own (vLLM: a request aborted), or that names none: not an answer
_NOT_FINISHED = {None, "abort"}
# a custom_id or a server's message is shown up to this many characters
_SHOWN = 200


# The code of a line that could not be read as a result line (not JSON, no custom_id, a
# field of the wrong type): unlike a result that reports a failure, it was not imported,
# so a corrected line with its id is read later (pipeline/batch/files.py).
BROKEN_LINE = "broken line"


def request_line(req: ChatRequest, body: dict[str, Any]) -> dict[str, Any]:
    """The batch line that asks ``req``; ``body`` is the chat-completions body to send."""
    return {"custom_id": req.key, "method": "POST", "url": CHAT_URL, "body": body}


@dataclass(frozen=True)
class Parsed:
    """What one result line says.

    - an answer: ``result`` is set; the runner still validates it as it validates every
      answer before anything is cached;
    - a failure: the line is about a request of this run, but holds no usable answer
      (an error, a non-200 status, another model, a reply without content); ``why`` says
      which; nothing is cached and the request is asked again;
    - a skip: the line cannot be taken at all (not JSON, a custom_id this run never
      asked, a second line for one custom_id); ``why`` says which.

    ``code`` is a short reason for counting; ``where`` is ``source:line``.
    """

    where: str
    custom_id: str | None = None
    result: ChatResult | None = None
    failed: bool = False
    code: str = ""
    why: str = ""
    # the line's own id (vLLM "vllm-...", OpenAI "batch_req_..."): a file imported twice
    # is told by it
    line_id: str | None = None

    @property
    def skipped(self) -> bool:
        return self.result is None and not self.failed

    @property
    def message(self) -> str:
        """``source:line: why`` (empty for an answer)."""
        return f"{self.where}: {self.why}" if self.why else ""


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def error_text(error: Any) -> str:
    """The message of a batch line's ``error`` or an error body: a string, OpenAI's
    ``{"code", "message"}``, or vLLM's ``ErrorResponse`` (``{"error": {...}}`` or
    ``{"object": "error", "message", ...}``). Secrets a server may echo are masked."""
    inner = error.get("error") if isinstance(error, dict) else None
    if isinstance(inner, (dict, str)):
        error = inner
    if isinstance(error, dict):
        message = error.get("message")
        code = error.get("code") or error.get("type")
        text = f"{code}: {message}" if code and message else str(message or code or error)
    else:
        text = str(error)
    return redact(_shown(text))


def read_results(
    lines: Iterable[str | bytes], expected: Mapping[str, ChatRequest], *, source: str
) -> Iterator[Parsed]:
    """Read result lines (one file's, or one stream's), each checked against the request
    it answers (``expected``: custom_id -> the request this run asked). Blank lines are
    passed over; every other line gives one :class:`Parsed`. A second line for one
    custom_id is skipped: the first one read is the answer."""
    seen: dict[str, int] = {}
    for n, raw in enumerate(lines, 1):
        where = f"{source}:{n}"
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield Parsed(where, code=BROKEN_LINE, why="not UTF-8 text")
                continue
        text = raw.strip()
        if not text:
            continue
        try:
            obj = json.loads(text)
        except ValueError as exc:
            yield Parsed(where, code=BROKEN_LINE, why=f"not a JSON line ({exc})")
            continue
        except RecursionError:  # one line must not stop the file's other lines
            yield Parsed(where, code=BROKEN_LINE, why="nested too deeply to be a result line")
            continue
        if not isinstance(obj, dict):
            yield Parsed(where, code=BROKEN_LINE, why="not a JSON object")
            continue
        line_id = obj.get("id") if isinstance(obj.get("id"), str) and obj["id"] else None
        cid = obj.get("custom_id")
        if not isinstance(cid, str) or not cid:
            yield Parsed(where, code=BROKEN_LINE, why="no custom_id", line_id=line_id)
            continue
        if cid not in expected:
            why = f"custom_id {_shown(cid)} was not asked by this run"
            yield Parsed(where, cid, code="not asked", why=why, line_id=line_id)
            continue
        if cid in seen:
            why = (
                f"custom_id {_shown(cid)} appears again (first on line {seen[cid]}); only "
                "the first is read"
            )
            yield Parsed(where, cid, code="duplicate", why=why, line_id=line_id)
            continue
        seen[cid] = n
        yield _answer(where, cid, obj, expected[cid], line_id)


# OpenAI answers a model name with the dated snapshot that served it ("gpt-4o-mini" ->
# "gpt-4o-mini-2024-07-18"): the same model, named precisely
_SNAPSHOT = re.compile(r"-\d{4}-\d{2}-\d{2}")


def same_model(asked: str, reported: Any) -> bool:
    """Whether a result line's ``model`` is the model its request asked for: the same name,
    or that name's dated snapshot as OpenAI reports it."""
    if not isinstance(reported, str):
        return False
    if reported == asked:
        return True
    return reported.startswith(asked) and _SNAPSHOT.fullmatch(reported[len(asked) :]) is not None


def _answer(
    where: str, cid: str, obj: dict[str, Any], req: ChatRequest, line_id: str | None
) -> Parsed:
    """The line of a request this run asked: its answer, or why it has none."""

    def failed(code: str, why: str) -> Parsed:
        return Parsed(where, cid, failed=True, code=code, why=why, line_id=line_id)

    if "response" not in obj and "error" not in obj and "body" in obj:
        return failed("request line", "a request line, not a result: import what the runner wrote")
    response = obj.get("response")
    status = response.get("status_code") if isinstance(response, dict) else None
    if obj.get("error") is not None:
        said = f"HTTP {status}: " if isinstance(status, int) and status != 200 else ""
        why = f"the request failed in the batch ({said}{error_text(obj['error'])})"
        return failed("error", why)
    if not isinstance(response, dict):
        return failed(BROKEN_LINE, "no response and no error")
    body = response.get("body")
    if isinstance(status, bool) or not isinstance(status, int):
        return failed(BROKEN_LINE, "response.status_code is not a number")
    if status != 200:
        shown = f": {error_text(body)}" if body else ""
        return failed(f"HTTP {status}", f"the request failed in the batch (HTTP {status}{shown})")
    if not isinstance(body, dict):
        return failed(BROKEN_LINE, "response.body is not a chat completion")
    model = body.get("model")
    if not same_model(req.model, model):
        return failed(
            "other model",
            f"answered by model {_shown(model)}, but the request asked for {_shown(req.model)}",
        )
    choices = body.get("choices")
    if isinstance(choices, list):
        for i, c in enumerate(choices):
            reason = c.get("finish_reason") if isinstance(c, dict) else None
            if reason in _NOT_FINISHED:
                return failed(
                    "unfinished",
                    f"choice {i} has finish_reason {json.dumps(reason)}: it was not finished",
                )
    try:
        result = parse_reply(body, req)
    except UnusableReply as exc:
        return failed("unusable reply", str(exc))
    if len(result.choices) != req.n:
        return failed(
            "wrong n", f"{len(result.choices)} answers, but the request asked for n={req.n}"
        )
    return Parsed(where, cid, result=result, line_id=line_id)
