"""A loopback server with OpenAI's Files and Batches endpoints, for the batch mode of the
openai backend (pipeline/backends/openai/batch.py), driven by the real ``openai`` SDK.

What it implements, as OpenAI documents it (platform.openai.com/docs/api-reference/batch
and /files):

- ``POST /v1/files`` (multipart ``file`` and ``purpose``), ``GET /v1/files/{id}``,
  ``GET /v1/files/{id}/content``;
- ``POST /v1/batches`` (``input_file_id``, ``endpoint``, ``completion_window`` "24h",
  ``metadata``), ``GET /v1/batches/{id}``, ``GET /v1/batches`` (newest first, ``limit``,
  ``after``), ``POST /v1/batches/{id}/cancel``;
- a batch advances one status per poll: validating, in_progress, finalizing, completed
  (``hold()`` keeps batches in progress until ``release()``); a file that breaks the
  API's rules (a line that is not JSON, a repeated custom_id, another endpoint, more than
  ``max_requests`` lines or ``max_bytes`` bytes) makes the batch ``failed`` with
  ``errors.data``; ``expire_next(k)`` makes the next batch answer ``k`` lines and end
  ``expired``, the rest in its error file with code ``batch_expired``;
- each line is answered by the stand-in's own answering (tests/standin_server.py: the
  rule-based player, bounded by max_tokens, within the schema), so answers read like a
  model's; a fault injected with ``inject`` (a 500, a 400...) turns that line into an
  error-file line with its status code and error body, as OpenAI's error file holds;
- ``request_counts`` (total, completed, failed), ``output_file_id``, ``error_file_id``,
  the ``*_at`` timestamps.

Counters for tests: ``creates`` (batches created), ``retrieves`` (polls per batch),
``uploads``, ``lines_answered``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from aiohttp import web
from standin_server import StandinServer, _error

OPENAI_MAX_REQUESTS = 50_000
OPENAI_MAX_BYTES = 200 * 1000 * 1000


class BatchesServer(StandinServer):
    """The stand-in chat server plus /v1/files and /v1/batches."""

    def __init__(
        self,
        *,
        max_requests: int = OPENAI_MAX_REQUESTS,
        max_bytes: int = OPENAI_MAX_BYTES,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.max_requests, self.max_bytes = max_requests, max_bytes
        self.files: dict[str, dict[str, Any]] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []  # batch ids, oldest first
        self.creates = 0
        self.uploads = 0
        self.lines_answered = 0
        self.retrieves: dict[str, int] = {}
        self._hold = False
        self._expire: list[int] = []

    # -- control (any thread) -------------------------------------------------------------
    def hold(self) -> None:
        """Keep every batch in progress until :meth:`release`."""
        self._hold = True

    def release(self) -> None:
        self._hold = False

    def expire_next(self, answered: int) -> None:
        """The next batch created answers ``answered`` lines, then expires."""
        with self._lock:
            self._expire.append(answered)

    def batch_lines(self, batch_id: str) -> list[dict[str, Any]]:
        """The request lines of a batch's input file."""
        data = self.files[self.batches[batch_id]["input_file_id"]]["data"]
        return [json.loads(x) for x in data.decode().splitlines() if x.strip()]

    def created_ids(self) -> list[str]:
        with self._lock:
            return list(self.order)

    # -- files ----------------------------------------------------------------------------
    def _file(self, data: bytes, purpose: str, filename: str) -> dict[str, Any]:
        fid = f"file-{uuid.uuid4().hex[:24]}"
        obj = {
            "id": fid,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
        }
        self.files[fid] = {"obj": obj, "data": data}
        return obj

    async def _upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose not in ("batch", "fine-tune", "assistants", "user_data", "vision", "evals"):
            return _error(400, f"Invalid purpose: {purpose!r}")
        if not isinstance(upload, web.FileField):
            return _error(400, "'file' must be a file upload")
        data = upload.file.read()
        if purpose == "batch" and not upload.filename.endswith(".jsonl"):
            return _error(400, "Batch files must be .jsonl")
        with self._lock:
            self.uploads += 1
        return web.json_response(self._file(data, str(purpose), upload.filename))

    async def _file_get(self, request: web.Request) -> web.Response:
        f = self.files.get(request.match_info["fid"])
        if f is None:
            return _error(404, "No such File object")
        return web.json_response(f["obj"])

    async def _file_content(self, request: web.Request) -> web.Response:
        f = self.files.get(request.match_info["fid"])
        if f is None:
            return _error(404, "No such File object")
        return web.Response(body=f["data"], content_type="application/octet-stream")

    # -- batches --------------------------------------------------------------------------
    async def _create(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "body must be JSON")
        fid = body.get("input_file_id")
        if fid not in self.files or self.files[fid]["obj"]["purpose"] != "batch":
            return _error(400, f"Invalid input_file_id {fid!r}: no file uploaded for batch")
        if body.get("completion_window") != "24h":
            return _error(400, "completion_window must be '24h'")
        endpoint = body.get("endpoint")
        if endpoint not in (
            "/v1/chat/completions",
            "/v1/embeddings",
            "/v1/completions",
            "/v1/responses",
        ):
            return _error(400, f"Invalid endpoint {endpoint!r}")
        now = int(time.time())
        bid = f"batch_{uuid.uuid4().hex[:24]}"
        with self._lock:
            self.creates += 1
            expire = self._expire.pop(0) if self._expire else None
            self.order.append(bid)
        self.batches[bid] = {
            "id": bid,
            "object": "batch",
            "endpoint": endpoint,
            "errors": None,
            "input_file_id": fid,
            "completion_window": "24h",
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + 86400,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": body.get("metadata"),
            "_expire": expire,
            "_out": [],
            "_err": [],
        }
        self.retrieves[bid] = 0
        return web.json_response(self._public(bid))

    def _public(self, bid: str) -> dict[str, Any]:
        return {k: v for k, v in self.batches[bid].items() if not k.startswith("_")}

    async def _retrieve(self, request: web.Request) -> web.Response:
        bid = request.match_info["bid"]
        if bid not in self.batches:
            return _error(404, f"No batch found with id '{bid}'")
        with self._lock:
            self.retrieves[bid] += 1
        await self._advance(bid)
        return web.json_response(self._public(bid))

    async def _list(self, request: web.Request) -> web.Response:
        limit = int(request.query.get("limit", 20))
        ids = list(reversed(self.order))
        after = request.query.get("after")
        if after in ids:
            ids = ids[ids.index(after) + 1 :]
        page = ids[:limit]
        data = [self._public(b) for b in page]
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "first_id": page[0] if page else None,
                "last_id": page[-1] if page else None,
                "has_more": len(ids) > limit,
            }
        )

    async def _cancel(self, request: web.Request) -> web.Response:
        bid = request.match_info["bid"]
        b = self.batches.get(bid)
        if b is None:
            return _error(404, f"No batch found with id '{bid}'")
        if b["status"] in ("validating", "in_progress", "finalizing"):
            b["status"], b["cancelling_at"] = "cancelling", int(time.time())
        return web.json_response(self._public(bid))

    def _validate(self, b: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The input file's lines, or None after marking the batch failed (errors.data)."""
        data = self.files[b["input_file_id"]]["data"]
        problems: list[dict[str, Any]] = []
        lines: list[dict[str, Any]] = []
        seen: set[str] = set()
        if len(data) > self.max_bytes:
            problems.append(
                {
                    "code": "file_too_large",
                    "line": None,
                    "message": f"The input file is larger than {self.max_bytes} bytes.",
                }
            )
        rows = data.decode("utf-8").splitlines()
        if len(rows) > self.max_requests:
            problems.append(
                {
                    "code": "too_many_requests",
                    "line": None,
                    "message": f"The batch input file has more than {self.max_requests} requests.",
                }
            )
        for n, raw in enumerate(rows, 1):
            try:
                line = json.loads(raw)
            except ValueError:
                problems.append(
                    {
                        "code": "invalid_json_line",
                        "line": n,
                        "message": "This line is not parseable as valid JSON.",
                    }
                )
                continue
            cid = line.get("custom_id") if isinstance(line, dict) else None
            if not isinstance(cid, str) or cid in seen:
                problems.append(
                    {
                        "code": "duplicate_custom_id",
                        "line": n,
                        "message": "The custom_id for this request is a duplicate.",
                    }
                )
                continue
            if line.get("url") != b["endpoint"] or line.get("method") != "POST":
                problems.append(
                    {
                        "code": "mismatched_endpoint",
                        "line": n,
                        "message": "The url of this request does not match the batch's endpoint.",
                    }
                )
                continue
            seen.add(cid)
            lines.append(line)
        if problems:
            now = int(time.time())
            b.update(
                status="failed",
                failed_at=now,
                errors={"object": "list", "data": [{"param": None, **p} for p in problems]},
            )
            return None
        return lines

    async def _advance(self, bid: str) -> None:
        """One status step per poll, as a slow provider would show them."""
        b = self.batches[bid]
        now = int(time.time())
        if b["status"] == "validating":
            lines = self._validate(b)
            if lines is not None:
                b["_lines"] = lines
                b["request_counts"]["total"] = len(lines)
                b["status"], b["in_progress_at"] = "in_progress", now
        elif b["status"] == "in_progress" and not self._hold:
            await self._answer(b)
            if b["_expire"] is not None:
                b["status"], b["expired_at"] = "expired", now
            else:
                b["status"], b["finalizing_at"] = "finalizing", now
            self._write_results(b)
        elif b["status"] == "finalizing":
            b["status"], b["completed_at"] = "completed", now
        elif b["status"] == "cancelling":
            self._write_results(b)
            b["status"], b["cancelled_at"] = "cancelled", now

    async def _answer(self, b: dict[str, Any]) -> None:
        todo = b["_lines"] if b["_expire"] is None else b["_lines"][: b["_expire"]]
        for line in todo:
            body = line.get("body")
            rid = f"req_{uuid.uuid4().hex[:24]}"
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                resp = _error(400, "body must be a JSON object with a 'messages' list")
            else:
                fault = self._take_fault(body)
                resp = await self._respond(body, fault)
            payload = json.loads(resp.body)  # type: ignore[arg-type]
            out = {
                "id": f"batch_req_{uuid.uuid4().hex[:24]}",
                "custom_id": line["custom_id"],
                "response": {"status_code": resp.status, "request_id": rid, "body": payload},
                "error": None,
            }
            if resp.status == 200:
                b["_out"].append(out)
                b["request_counts"]["completed"] += 1
            else:
                b["_err"].append(out)
                b["request_counts"]["failed"] += 1
            with self._lock:
                self.lines_answered += 1
        for line in b["_lines"][len(todo) :]:
            b["_err"].append(
                {
                    "id": f"batch_req_{uuid.uuid4().hex[:24]}",
                    "custom_id": line["custom_id"],
                    "response": None,
                    "error": {
                        "code": "batch_expired",
                        "message": "This request could not be executed before the "
                        "completion window expired.",
                    },
                }
            )

    def _write_results(self, b: dict[str, Any]) -> None:
        for key, field, purpose in (
            ("_out", "output_file_id", "batch_output"),
            ("_err", "error_file_id", "batch_output"),
        ):
            if b[key] and b[field] is None:
                data = "".join(json.dumps(x) + "\n" for x in b[key]).encode()
                b[field] = self._file(data, purpose, f"{b['id']}{key}.jsonl")["id"]

    # -- lifecycle: the stand-in's routes plus these -------------------------------------
    async def _start_site(self) -> None:
        self._closing = asyncio.Event()
        app = web.Application(client_max_size=256 * 1024**2, middlewares=[self._auth])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/files", self._upload)
        app.router.add_get("/v1/files/{fid}", self._file_get)
        app.router.add_get("/v1/files/{fid}/content", self._file_content)
        app.router.add_post("/v1/batches", self._create)
        app.router.add_get("/v1/batches", self._list)
        app.router.add_get("/v1/batches/{bid}", self._retrieve)
        app.router.add_post("/v1/batches/{bid}/cancel", self._cancel)
        self._runner = web.AppRunner(
            app, access_log=None, shutdown_timeout=1.0, handler_cancellation=True
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=1024)
        await site.start()
        self.port = self._runner.addresses[0][1]
