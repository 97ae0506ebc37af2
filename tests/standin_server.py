"""A stand-in OpenAI-compatible chat-completions server for tests and benchmarks.

It speaks the real HTTP protocol on 127.0.0.1, so the real ``openai`` client (and any other
HTTP client) can talk to it. Answers are deterministic, JSON-schema requests get a document
that validates against the schema, and tests can inject faults (429, 5xx, timeouts, broken
bodies, truncated or invalid-JSON answers) at run time.

By default (``mode="player"``) the pipeline's own prompts are answered by a rule-based
player (``standin_player.py``) that behaves like a simple, consistent model: answers cover
the points they are asked to cover and verdicts follow the text they judge, so a whole run
keeps most examples. Anything else, and everything with ``mode="filler"``, gets filler:
random English-ish words, or random values valid against the schema. It is not a model.

Token counts are approximated by whitespace-split word counts.

It can play a reasoning model (``reasoning="inline"`` or ``"field"``): every answer comes
after ``reasoning_words`` words of reasoning, either in the content as a ``<think>`` block
(what llama.cpp, or a server without a reasoning parser, returns) or apart in the message's
``reasoning`` field with the content the answer alone (what ``vllm serve --reasoning-parser``
returns; ``null`` content when the reasoning used every token). The reasoning counts
against ``max_tokens`` like any output; the ``reasoning_length`` fault makes the next
matching request's reasoning run past it, so it never ends.

In-process use::

    with StandinServer(latency_ms=5) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test")

As a separate process (so it does not share the GIL with the client being measured)::

    python tests/standin_server.py --port 0 --latency-ms 200 --latency-sigma 0.8 --port-file p
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import inspect
import json
import math
import os
import random
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web
from standin_player import ModelPlayer

from pipeline.backends.instance import schema_instance

Responder = Callable[[dict[str, Any], int], Any]

MODES = ("player", "filler")
FAULT_KINDS = (
    "429", "500", "503", "400", "401", "slow", "malformed", "length", "bad_json",
    "reasoning_length",
)  # fmt: skip
REASONING_MODES = ("inline", "field")
_WORD_CAP = re.compile(r"at most (\d+) words", re.IGNORECASE)
_WORD_TEXT = (
    "the a response should clearly address user needs while staying concise and helpful it "
    "considers context preferences tone detail examples evidence structure clarity accuracy "
    "because people value practical advice that fits their situation goals constraints and "
    "background so a good answer explains reasoning offers options notes tradeoffs and "
    "suggests next steps with care honesty warmth precision depth balance"
)
_WORDS = _WORD_TEXT.split()
_MALFORMED = '{"id": "chatcmpl-oops", "choi'  # truncated mid-token: not parseable JSON
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_api_key",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "service_unavailable",
}


def _rng_for(body: dict[str, Any], index: int) -> random.Random:
    """Seed a private RNG from the inputs that define one choice, so answers are reproducible."""
    key = [body.get("model"), body.get("messages"), body.get("seed"), body.get("temperature")]
    digest = hashlib.sha256(json.dumps([*key, index], sort_keys=True, default=str).encode())
    return random.Random(digest.hexdigest())


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def text_answer(rng: random.Random, messages: list[dict[str, Any]]) -> str:
    """An English-ish answer of 40-90 words, capped by 'at most N words' in the last user turn."""
    n_words = rng.randint(40, 90)
    user_turns = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if user_turns and (cap := _WORD_CAP.search(_message_text(user_turns[-1]))):
        n_words = min(n_words, int(cap.group(1)))
    words: list[str] = []
    sentence_left = 0
    for i in range(n_words):
        word = rng.choice(_WORDS)
        if sentence_left == 0:
            word, sentence_left = word.capitalize(), rng.randint(6, 14)
        sentence_left -= 1
        if sentence_left == 0 or i == n_words - 1:
            word, sentence_left = word + ".", 0
        words.append(word)
    return " ".join(words)


def reasoning_text(rng: random.Random, words: int) -> str:
    """A stand-in reasoning of ``words`` words (filler, not reasoning)."""
    head = "Okay, let me think about what this user asked and how to answer it.".split()
    body = head + [rng.choice(_WORDS) for _ in range(max(0, words - len(head)))]
    return " ".join(body[:words])


def generate_from_schema(
    schema: dict[str, Any], rng: random.Random, root: dict[str, Any] | None = None, depth: int = 0
) -> Any:
    """Build a value that validates against a (pydantic-style) JSON schema: the project's
    generator (pipeline/backends/instance.py) with the stand-in's words."""
    return schema_instance(schema, rng, root, depth, words=_WORDS)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"error": {"message": message, "type": _ERROR_TYPES.get(status, "error"),
                      "param": None, "code": _ERROR_TYPES.get(status)}}  # fmt: skip
    return web.json_response(body, status=status, headers=headers)


class StandinServer:
    """Deterministic OpenAI-compatible chat server running on 127.0.0.1.

    ``latency_ms``/``latency_sigma``: each request sleeps ``median * exp(sigma * N(0, 1))`` ms,
    drawn from a ``random.Random(latency_seed)`` owned by the server. ``responder(body, i)``
    may return the content for choice ``i`` (a str, or an awaitable of one); ``None`` falls
    back to the generated answer. It runs on the server thread, and its content is still
    subject to ``max_tokens`` truncation and injected content faults. ``mode``: "player"
    answers the pipeline's prompts like a simple model (``max_points``: the most points one
    generated answer covers), "filler" answers everything with filler. ``authorization``:
    when set, every request must carry exactly this Authorization header (e.g. "Bearer KEY"
    or "Basic ..."), else it gets a 401 like a server started with an API key.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = "standin-model",
        latency_ms: float = 0.0,
        latency_sigma: float = 0.0,
        latency_seed: int = 0,
        responder: Responder | None = None,
        mode: str = "player",
        max_points: int = 3,
        responder_name: str | None = None,
        report_as: dict[str, Any] | None = None,
        authorization: str | None = None,
        reasoning: str | None = None,
        reasoning_words: int = 40,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
        if reasoning is not None and reasoning not in REASONING_MODES:
            raise ValueError(f"unknown reasoning {reasoning!r}; expected one of {REASONING_MODES}")
        self.reasoning, self.reasoning_words = reasoning, reasoning_words
        self.host, self.port, self.model = host, port, model
        self.mode = mode
        self.player = ModelPlayer(generate_from_schema, max_points=max_points)
        self.latency_ms, self.latency_sigma = latency_ms, latency_sigma
        self.responder = responder
        # what /v1/models says answers (recorded as the run's provenance)
        # report_as: the /v1/models entry to show instead of the stand-in's own (a test that
        # needs a server posing as another backend, e.g. {"owned_by": "vllm"})
        self.report_as = report_as
        self.responder_name = responder_name or (
            "custom" if responder is not None else {"player": "rule-based"}.get(mode, mode)
        )
        if reasoning is not None and responder_name is None:
            self.responder_name += f", reasoning {reasoning}"
        self.authorization = authorization
        self.refused = 0  # requests answered 401 for a missing or wrong Authorization
        self._latency_rng = random.Random(latency_seed)
        self._lock = threading.Lock()  # guards records, faults and the latency RNG
        self._records: list[dict[str, Any]] = []
        self._faults: list[dict[str, Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None

    # -- control API (any thread) ---------------------------------------------------------
    @property
    def base_url(self) -> str:
        """Base URL for ``openai.OpenAI(base_url=...)``, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Snapshot of request records: ``{"body", "status", "fault", "time"}``."""
        with self._lock:
            return list(self._records)

    @property
    def request_count(self) -> int:
        """Number of requests received so far (all routes' chat calls, faults included)."""
        with self._lock:
            return len(self._records)

    def inject(
        self,
        kind: str,
        count: int = 1,
        *,
        match: Callable[[dict[str, Any]], bool] | None = None,
        **kw: Any,
    ) -> None:
        """Queue ``count`` faults of ``kind`` for the next matching requests, in order."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {FAULT_KINDS}")
        with self._lock:
            self._faults.extend({"kind": kind, "match": match, "kw": kw} for _ in range(count))

    def reset(self) -> None:
        """Forget recorded requests and pending faults."""
        with self._lock:
            self._records.clear()
            self._faults.clear()

    # -- request handling (server loop) ---------------------------------------------------
    def _take_fault(self, body: dict[str, Any]) -> dict[str, Any] | None:
        with self._lock:
            for i, fault in enumerate(self._faults):
                if fault["match"] is None or fault["match"](body):
                    return self._faults.pop(i)
        return None

    async def _sleep(self, seconds: float) -> None:
        # Waiting on the closing event lets stop() finish without waiting out "slow" faults.
        if seconds > 0 and self._closing is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._closing.wait(), seconds)

    async def _models(self, request: web.Request) -> web.Response:
        if self.report_as is not None:
            entry = {"id": self.model, "object": "model", "created": 0, **self.report_as}
            return web.json_response({"object": "list", "data": [entry]})
        # it says what it is: the pipeline records answers from it as not model output
        data = [
            {
                "id": self.model,
                "object": "model",
                "created": 0,
                "owned_by": "prb-stand-in",
                "prb_responder": self.responder_name,
            }
        ]
        return web.json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        record: dict[str, Any] = {
            "body": None,
            "status": 0,
            "fault": None,
            "time": time.time(),
            "query": dict(request.query),
        }
        with self._lock:
            self._records.append(record)
            noise = self._latency_rng.gauss(0.0, 1.0)
        latency_ms = self.latency_ms * math.exp(self.latency_sigma * noise)  # log-normal
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            record["status"] = 400
            return _error(400, "body must be a JSON object with a 'messages' list")
        record["body"] = body
        fault = self._take_fault(body)
        record["fault"] = fault and fault["kind"]
        try:
            response = await self._respond(body, fault)
        except Exception as exc:  # a failing test responder should surface, not hang the client
            response = _error(500, f"stand-in server error: {exc!r}")
        record["status"] = response.status
        extra = fault["kw"].get("delay", 5.0) if fault and fault["kind"] == "slow" else 0.0
        await self._sleep(latency_ms / 1000.0 + extra)
        return response

    async def _respond(self, body: dict[str, Any], fault: dict[str, Any] | None) -> web.Response:
        kind = fault["kind"] if fault else None
        if kind == "429":
            retry_after = fault["kw"].get("retry_after", 0.05)  # type: ignore[index]
            return _error(429, "Rate limit reached (injected)", {"Retry-After": f"{retry_after:g}"})
        if kind in ("500", "503", "400", "401"):  # inject(kind, message=...) sets the text
            message = fault["kw"].get("message")  # type: ignore[index]
            return _error(int(kind), message or f"injected {kind} fault")
        if kind == "malformed":
            return web.Response(text=_MALFORMED, content_type="application/json")
        if body.get("stream"):
            return _error(400, "the stand-in server does not support stream=true")
        n = body.get("n") or 1
        if not isinstance(n, int) or n < 1:
            return _error(400, "'n' must be a positive integer")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        choices, completion_tokens = [], 0
        for i in range(n):
            content = await self._content(body, i)
            finish = "stop"
            think: list[str] = []
            if self.reasoning is not None:
                words_n = self.reasoning_words
                if kind == "reasoning_length":  # a reasoning that never ends within the limit
                    words_n = (max_tokens or 512) + 10
                think = reasoning_text(_rng_for(body, i), words_n).split()
                room = max_tokens - len(think) if max_tokens else None
                if room is not None and room <= 0:  # the limit is reached inside the reasoning
                    think, content, finish = think[:max_tokens], "", "length"
                elif room is not None and len(content.split()) > room:
                    content, finish = " ".join(content.split()[:room]), "length"
            words = content.split()
            if kind == "bad_json":
                content = '{"aspects": ['
            elif kind == "length":  # cut mid-answer, as a real model hitting its limit would
                content, finish = content[: max(1, len(content) // 2)], "length"
            elif self.reasoning is None and max_tokens and len(words) > max_tokens:
                content, finish = " ".join(words[:max_tokens]), "length"
            completion_tokens += len(content.split()) + len(think)
            message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
            if self.reasoning == "field":  # vLLM 0.26's server with --reasoning-parser
                message["reasoning"] = " ".join(think)
                if finish == "length" and not content:
                    message["content"] = None
            elif self.reasoning == "inline":
                closed = "" if finish == "length" and not content else "\n</think>\n\n"
                message["content"] = "<think>\n" + " ".join(think) + closed + content
            choices.append({"index": i, "message": message, "finish_reason": finish,
                            "logprobs": None})  # fmt: skip
        prompt_tokens = sum(len(_message_text(m).split()) for m in body["messages"])
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}  # fmt: skip
        return web.json_response({
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": choices,
            "usage": usage,
            "system_fingerprint": "standin",
        })  # fmt: skip

    async def _content(self, body: dict[str, Any], index: int) -> str:
        if self.responder is not None:
            crafted = self.responder(body, index)
            if inspect.isawaitable(crafted):
                crafted = await crafted
            if isinstance(crafted, str):
                return crafted
        if self.mode == "player" and (played := self.player.answer(body, index)) is not None:
            return played
        rng = _rng_for(body, index)
        fmt = body.get("response_format") or {}
        if fmt.get("type") == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema") or {"type": "object"}
            return json.dumps(generate_from_schema(schema, rng))
        if fmt.get("type") == "json_object" and isinstance(fmt.get("schema"), dict):
            # llama-cpp-python's form: json_object held to the schema given with it
            return json.dumps(generate_from_schema(fmt["schema"], rng))
        if fmt.get("type") == "json_object":
            return json.dumps({"answer": text_answer(rng, body["messages"])})
        return text_answer(rng, body["messages"])

    # -- lifecycle ------------------------------------------------------------------------
    async def _start_site(self) -> None:
        self._closing = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024**2, middlewares=[self._auth])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(
            app, access_log=None, shutdown_timeout=1.0, handler_cancellation=True
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=1024)
        await site.start()
        self.port = self._runner.addresses[0][1]  # resolve port 0 to the bound port

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.authorization is not None and (
            request.headers.get("Authorization") != self.authorization
        ):
            with self._lock:
                self.refused += 1
            return _error(401, "Incorrect API key provided.")
        return await handler(request)

    async def _stop_site(self) -> None:
        if self._closing is not None:
            self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start(self) -> StandinServer:
        """Serve from a background thread with its own event loop; returns once listening."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        loop = asyncio.new_event_loop()
        started, errors = threading.Event(), []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start_site())
            except BaseException as exc:  # e.g. port in use: hand it to the caller of start()
                errors.append(exc)
                return
            finally:
                started.set()
            loop.run_forever()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="standin-server", daemon=True)
        self._thread.start()
        if not started.wait(10) or errors:
            self._thread.join(1)
            self._thread = self._loop = None
            loop.close()
            raise RuntimeError(f"stand-in server failed to bind {self.host}:{self.port}") from (
                errors[0] if errors else None
            )
        return self

    def stop(self) -> None:
        """Stop serving and join the background thread (idempotent)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._stop_site(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> StandinServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def serve_forever(self, port_file: str | None = None) -> None:
        """Foreground mode: serve on the running loop until SIGTERM or SIGINT."""
        await self._start_site()
        if port_file:  # write-then-rename so a polling reader never sees a partial file
            tmp = f"{port_file}.tmp{os.getpid()}"
            with open(tmp, "w") as fh:
                fh.write(f"{self.port}\n")
            os.replace(tmp, port_file)
        kind = "rule-based filler" if self.mode == "player" else "filler"
        print(
            f"stand-in OpenAI server listening on {self.base_url} (answers are {kind}, "
            "not a model)",
            file=sys.stderr,
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await self._stop_site()


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: run the stand-in server in the foreground."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    ap.add_argument("--port-file", help="write the bound port here once listening")
    ap.add_argument("--model", default="standin-model")
    ap.add_argument("--latency-ms", type=float, default=0.0, help="median per-request latency")
    ap.add_argument("--latency-sigma", type=float, default=0.0, help="log-normal spread")
    ap.add_argument("--latency-seed", type=int, default=0)
    ap.add_argument(
        "--mode",
        choices=MODES,
        default="player",
        help="player: answer the pipeline's prompts like a simple model; filler: filler only",
    )
    ap.add_argument("--max-points", type=int, default=3, help="player: points per answer")
    ap.add_argument(
        "--reasoning",
        choices=REASONING_MODES,
        default=None,
        help="play a reasoning model: a <think> block in the content (inline) or a separate "
        "reasoning field (field, as vllm serve --reasoning-parser returns)",
    )
    ap.add_argument("--reasoning-words", type=int, default=40, help="words of reasoning")
    opts = vars(ap.parse_args(argv))  # flag names match the constructor's keyword names
    port_file = opts.pop("port_file")
    asyncio.run(StandinServer(**opts).serve_forever(port_file))


if __name__ == "__main__":
    main()
