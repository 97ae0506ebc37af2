"""The Batch API as a mode of the openai backend (``backend.openai.batch: true``).

The runner feeds requests as always; here they are gathered (the backend's window is
``batch_window``, up to the API's 50,000), written as batch JSONL, split into files at
the API's limits (``batch_max_requests``, ``batch_max_bytes``), uploaded
(``files.create(purpose="batch")``), submitted (``batches.create``), polled every
``batch_poll_s`` with a progress line, and their output and error files downloaded.
Each answer goes back to the runner, which validates it and re-asks as always; re-asks,
and lines the error file says re-sending can fix (a 5xx, a 429, ``batch_expired``), go
into the next round of batches of the same run, up to ``backend.max_attempts``.

Every batch is recorded in the run directory (``openai-batches/``, one JSON file per
batch, written atomically) before its file is uploaded, again with the file's id before
the batch is created, and with the batch's id before it is first polled. A run killed
after it submitted a batch resumes by polling that batch: a request whose key is among a
recorded batch's ``custom_ids`` is never submitted again. A kill between ``create`` and
the record of its id is found again by listing the account's batches (the input file's
id, the ``prb_batch`` metadata). Downloaded results are kept beside the record until the
runner has taken them, so a kill before the answers reach the cache loses none.

Statuses: validating, in_progress, finalizing and cancelling are polled again; completed
and expired hand over every answered line (an expired batch's other lines are submitted
again); cancelled hands over what was answered and fails the rest (retried on the next
run); failed (the file was refused) stops the stage with the API's own reason.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import openai
from tenacity import AsyncRetrying

from pipeline.backends.identity import plain_url
from pipeline.backends.openai.lines import Parsed, read_results, request_line
from pipeline.backends.openai.wire import (
    UnusableReply,
    auth_error,
    check_reachable,
    describe_error,
    is_transient,
)
from pipeline.core.errors import BackendError
from pipeline.core.io import atomic_open, read_json, write_json_atomic
from pipeline.core.progress import BatchProgress
from pipeline.core.redact import public_url
from pipeline.kinds.backend import BackendSection, RequestFeed
from pipeline.types.chat import ChatRequest, ChatResult, RequestFailure

ENDPOINT: Literal["/v1/chat/completions"] = "/v1/chat/completions"  # = lines.CHAT_URL
COMPLETION_WINDOW: Literal["24h"] = "24h"  # the only window the API offers
IN_FLIGHT = ("validating", "in_progress", "finalizing", "cancelling")
FINAL = ("completed", "failed", "expired", "cancelled")
# a record's states, in order: written before the upload, after it, after batches.create,
# and once the batch is final and its files are stored beside the record
PREPARED, UPLOADED, SUBMITTED, FINISHED = "prepared", "uploaded", "submitted", "finished"
# per-line error codes that sending the request again can fix
_RESEND_CODES = {"batch_expired", "rate_limit_exceeded", "server_error", "timeout"}
_RESEND_STATUS = {408, 409, 425, 429}


@dataclass
class LineError:
    """A result line of a request that holds no usable answer."""

    reason: str
    resend: bool  # sending the request again can fix it


def _resend(parsed: Parsed, raw: list[str]) -> bool:
    """Whether sending a failed line's request again can fix it: a 5xx, a 429, a timeout,
    an expired batch, an unusable reply; not a refusal of the request itself (a 400),
    another model or a wrong number of answers, which would come back the same."""
    code = parsed.code
    if code.startswith("HTTP "):
        status = int(code[5:]) if code[5:].isdigit() else 0
        return status in _RESEND_STATUS or status >= 500
    if code == "error":  # the line's own error object says which
        try:
            obj = json.loads(raw[int(parsed.where.rsplit(":", 1)[1]) - 1])
        except (ValueError, IndexError):
            return False
        error = obj.get("error")
        response = obj.get("response")
        said = response.get("status_code") if isinstance(response, dict) else None
        if isinstance(said, int) and said != 200:
            return said in _RESEND_STATUS or said >= 500
        return isinstance(error, dict) and error.get("code") in _RESEND_CODES
    return code in ("unusable reply", "unfinished", "broken line")


def read_lines(
    text: str, expected: dict[str, ChatRequest], source: str
) -> dict[str, ChatResult | LineError]:
    """The outcome of every expected request a batch's output or error file answers, read
    by ``lines.read_results``; lines it skips (not asked, repeated, broken) answer none."""
    raw = text.splitlines()
    out: dict[str, ChatResult | LineError] = {}
    for parsed in read_results(raw, expected, source=source):
        key = parsed.custom_id
        if key is None or parsed.skipped or key in out:
            continue
        if parsed.result is not None:
            out[key] = parsed.result
        else:
            reason = f"batch {parsed.code}: {parsed.why} ({parsed.where})"
            out[key] = LineError(reason[:500], resend=_resend(parsed, raw))
    return out


# ---- the record in the run directory ------------------------------------------------------


class Ledger:
    """The records of one run's batches: ``<local>.json`` per batch, and its downloaded
    ``<local>.output.jsonl`` / ``<local>.errors.jsonl``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def records(self) -> list[dict[str, Any]]:
        """Every record, oldest first; a file that is not a record is one BackendError."""
        if not self.folder.is_dir():
            return []
        out = []
        for path in sorted(self.folder.glob("*.json")):
            try:
                rec = read_json(path)
            except (OSError, ValueError, UnicodeDecodeError):
                rec = None
            if not isinstance(rec, dict) or not isinstance(rec.get("custom_ids"), list):
                raise BackendError(
                    f"{path}: not a batch record written by prb; move it out of "
                    f"{self.folder} and run again"
                )
            out.append(rec)
        return sorted(out, key=lambda r: (r.get("created") or 0, r.get("local") or ""))

    def save(self, rec: dict[str, Any]) -> None:
        write_json_atomic(self.folder / f"{rec['local']}.json", rec)

    def drop(self, rec: dict[str, Any]) -> None:
        (self.folder / f"{rec['local']}.json").unlink(missing_ok=True)

    def results(self, rec: dict[str, Any], kind: str) -> Path:
        return self.folder / f"{rec['local']}.{kind}.jsonl"


def in_flight(folder: Path) -> list[dict[str, Any]]:
    """The recorded batches not final yet (``prb status``); unreadable records are skipped."""
    try:
        records = Ledger(folder).records()
    except BackendError:
        return []
    return [r for r in records if r.get("state") in (UPLOADED, SUBMITTED)]


def status_lines(folder: Path) -> list[str]:
    """``prb status``'s lines for the batches in flight (as last polled)."""
    lines = []
    for rec in in_flight(folder):
        counts = rec.get("request_counts") or {}
        total = counts.get("total") or len(rec["custom_ids"])  # 0 while validating
        done = f"{counts.get('completed', 0)} of {total}"
        lines.append(
            f"batch {rec.get('batch_id') or '(being created)'}: {rec.get('status') or 'uploaded'}"
            f", {done} answered, {counts.get('failed', 0)} failed (as last polled)"
        )
    return lines


# ---- the rounds ---------------------------------------------------------------------------


class BatchRunner:
    """Answers a runner's feed through the Batch API (see the module's docstring)."""

    def __init__(
        self,
        cfg: BackendSection,
        client: openai.AsyncOpenAI,
        retrying: dict[str, Any],
        folder: Path,
        body: Callable[[ChatRequest], dict[str, Any]] | None = None,
        answer: Callable[[ChatRequest, ChatResult], ChatResult] | None = None,
    ) -> None:
        """The openai backend's ``cfg`` (the server is ``cfg.openai``), its ``client`` and
        its ``retrying`` (tenacity's arguments for a transient error); ``body``: the
        chat-completions body a request is sent with (default ``ChatRequest.openai_body``);
        ``answer``: what the backend makes of a reply before the runner sees it (default:
        the reply as it is). The live path's own, so that a server's dialect reads the same
        in both modes."""
        self.cfg = cfg
        self.retrying = retrying
        self.server = cfg.openai
        self.client = client
        self.ledger = Ledger(folder)
        self.body = body or ChatRequest.openai_body
        self.answer = answer or (lambda req, result: result)
        self.url = plain_url(self.server.base_url)
        self.max_attempts = cfg.max_attempts
        self.records: list[dict[str, Any]] = []
        self._taken: list[dict[str, Any]] = []  # handed to the runner, not yet marked so

    async def stream(
        self, feed: RequestFeed
    ) -> AsyncIterator[tuple[Any, ChatResult | RequestFailure]]:
        try:
            async for item in self._rounds(feed):
                yield item
        finally:
            self._mark_taken()  # the feed closed: the runner has taken every answer

    async def _rounds(
        self, feed: RequestFeed
    ) -> AsyncIterator[tuple[Any, ChatResult | RequestFailure]]:
        retry: list[tuple[Any, ChatRequest]] = []
        attempts: dict[str, int] = {}
        started = False
        while True:
            items = await self._collect(feed, wait=not retry)
            self._mark_taken()  # the runner has handled the answers of the last round
            items, retry = retry + items, []
            if not items:
                return
            if not started:
                # reached only when a request is not cached: a cached stage needs no server
                await asyncio.to_thread(check_reachable, self.server)
                self.records = self.ledger.records()
                await self._recover()
                started = True
            waiters: dict[str, list[tuple[Any, ChatRequest]]] = {}
            for token, req in items:
                waiters.setdefault(req.key, []).append((token, req))
            claims = self._claim(waiters)
            claimed = {k for keys in claims.values() for k in keys}
            fresh = [k for k in waiters if k not in claimed]
            files, too_big = self._split(fresh, waiters)
            for key in too_big:
                reason = (
                    f"the request is larger than a batch file may be "
                    f"(backend.openai.batch_max_bytes = {self.server.batch_max_bytes:,})"
                )
                for token, _ in waiters[key]:
                    yield token, RequestFailure(reason, 0, transient=False)
            for lines in files:
                rec = await self._submit(lines)
                claims[rec["local"]] = {k for k, _ in lines}
            async for token, outcome in self._poll(claims, waiters, retry, attempts):
                yield token, outcome

    # ---- gathering --------------------------------------------------------------------
    async def _collect(self, feed: RequestFeed, *, wait: bool) -> list[tuple[Any, ChatRequest]]:
        """The requests of the next round. The runner queues its window at once and
        follow-ups (re-asks, pushed jobs) as it handles answers, so the round waits until
        the queue has been unchanged for ``batch_collect_s``."""
        out: list[tuple[Any, ChatRequest]] = []
        if wait:
            first = await feed.get()
            if first is None:
                return out
            out.append(first)
        quiet = self.server.batch_collect_s
        loop = asyncio.get_running_loop()
        last, since = len(feed), loop.time()
        while len(out) + len(feed) < self.server.batch_window:
            await asyncio.sleep(min(0.05, quiet) if quiet else 0)
            if len(feed) != last:
                last, since = len(feed), loop.time()
            elif loop.time() - since >= quiet:
                break
        room = self.server.batch_window - len(out)
        if len(feed) and room > 0:
            out += await feed.take(min(room, len(feed)))
        return out

    def _claim(self, waiters: dict[str, list[tuple[Any, ChatRequest]]]) -> dict[str, set[str]]:
        """The recorded batches (a killed run's) that answer some of ``waiters``: polled or
        read back instead of submitting those requests again; the newest first."""
        claims: dict[str, set[str]] = {}
        taken: set[str] = set()
        for rec in reversed(self.records):
            if rec.get("url") != self.url or rec.get("delivered"):
                continue
            if rec.get("state") == FINISHED and rec.get("status") == "failed":
                continue
            if rec.get("state") not in (SUBMITTED, FINISHED):
                continue
            keys = (set(rec["custom_ids"]) & waiters.keys()) - taken
            if keys:
                claims[rec["local"]] = keys
                taken |= keys
        return claims

    def _split(
        self, keys: Iterable[str], waiters: dict[str, list[tuple[Any, ChatRequest]]]
    ) -> tuple[list[list[tuple[str, bytes]]], list[str]]:
        """Batch input files within the API's limits, and the keys of requests too large
        for any file."""
        s = self.server
        files: list[list[tuple[str, bytes]]] = []
        current: list[tuple[str, bytes]] = []
        size = 0
        too_big: list[str] = []
        for key in keys:
            req = waiters[key][0][1]
            line = request_line(req, self.body(req))
            try:
                data = (json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: escaped, as the live client sends it
                data = (json.dumps(line) + "\n").encode("ascii")
            if len(data) > s.batch_max_bytes:
                too_big.append(key)
                continue
            if current and (
                len(current) >= s.batch_max_requests or size + len(data) > s.batch_max_bytes
            ):
                files.append(current)
                current, size = [], 0
            current.append((key, data))
            size += len(data)
        if current:
            files.append(current)
        return files, too_big

    # ---- the API ----------------------------------------------------------------------
    async def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """One API call with the backend's retries; refused credentials and other errors
        are one BackendError naming the call."""
        try:
            async for attempt in AsyncRetrying(**self.retrying):
                with attempt:
                    return await fn(*args, **kw)
        except openai.APIStatusError as exc:
            if exc.status_code in (401, 403):
                raise auth_error(self.server, exc.status_code, exc.message) from None
            if exc.status_code in (404, 405):
                raise BackendError(
                    f"the server at {public_url(self.server.base_url)} has no Batch API "
                    f"({what} got HTTP {exc.status_code}); set backend.openai.batch to false, "
                    "or point backend.openai.base_url at a server that has one (OpenAI's)"
                ) from None
            raise BackendError(f"the Batch API refused {what}: {describe_error(exc)}") from None
        except Exception as exc:
            raise BackendError(f"the Batch API failed at {what}: {describe_error(exc)}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _submit(self, lines: list[tuple[str, bytes]]) -> dict[str, Any]:
        """Upload one file and create its batch; the record is written before each step,
        so a kill at any point leaves a record that says how far it got."""
        local = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        data = b"".join(d for _, d in lines)
        rec: dict[str, Any] = {
            "local": local,
            "created": time.time(),
            "url": self.url,
            "state": PREPARED,
            "requests": len(lines),
            "bytes": len(data),
            "custom_ids": [k for k, _ in lines],
        }
        self.ledger.save(rec)
        self.records.append(rec)
        try:
            uploaded = await self._call(
                "the upload of a batch file",
                self.client.files.create,
                file=(f"prb-{local}.jsonl", data, "application/jsonl"),
                purpose="batch",
            )
        except BackendError:  # refused: no file, no batch, nothing to record
            self.ledger.drop(rec)
            self.records.remove(rec)
            raise
        rec.update(state=UPLOADED, input_file_id=uploaded.id)
        self.ledger.save(rec)
        # not retried blindly: a create whose answer was lost may have made the batch, and a
        # second would be paid twice; the account's batches are looked at first
        batch = None
        for attempt in range(1, self.max_attempts + 1):
            try:
                batch = await self.client.batches.create(
                    input_file_id=uploaded.id,
                    endpoint=ENDPOINT,
                    completion_window=COMPLETION_WINDOW,
                    metadata={"prb_batch": local},
                )
                break
            except Exception as exc:
                if isinstance(exc, openai.APIStatusError) and exc.status_code in (401, 403):
                    raise auth_error(self.server, exc.status_code, exc.message) from None
                if not is_transient(exc) or attempt == self.max_attempts:
                    raise BackendError(
                        f"the Batch API refused to create a batch from {uploaded.id}: "
                        f"{describe_error(exc)} (recorded in {self.ledger.folder})"
                    ) from None
                batch = await self._find(rec)
                if batch is not None:
                    break
                await asyncio.sleep(min(self.cfg.backoff_initial_s * 2**attempt,
                                        self.cfg.backoff_max_s))  # fmt: skip
        assert batch is not None
        self._update(rec, batch, state=SUBMITTED)  # before the first poll
        print(
            f"openai batch {batch.id}: {len(lines):,} requests submitted ({len(data):,} bytes), "
            f"recorded in {self.ledger.folder}",
            file=sys.stderr,
            flush=True,
        )
        return rec

    async def _find(self, rec: dict[str, Any]) -> Any:
        """The batch made from ``rec``'s input file, when the account has one; the list is
        newest first, so it stops at batches older than the record."""
        try:
            async for batch in self.client.batches.list(limit=100):
                meta = batch.metadata or {}
                if batch.input_file_id == rec.get("input_file_id") or (
                    meta.get("prb_batch") == rec["local"]
                ):
                    return batch
                if batch.created_at and batch.created_at < (rec.get("created") or 0) - 3600:
                    break
        except openai.OpenAIError:
            return None
        return None

    async def _recover(self) -> None:
        """Records a killed run left before its batch was created: the batch is looked up
        (the create may have gone through); not found, the record goes and its requests
        are submitted again (a file uploaded without a batch costs nothing)."""
        for rec in list(self.records):
            if rec.get("url") != self.url or rec.get("state") not in (PREPARED, UPLOADED):
                continue
            batch = await self._find(rec) if rec.get("input_file_id") else None
            if batch is not None:
                self._update(rec, batch, state=SUBMITTED)
            else:
                self.ledger.drop(rec)
                self.records.remove(rec)

    def _update(self, rec: dict[str, Any], batch: Any, state: str | None = None) -> None:
        """The batch's latest status and counts into its record, written when they change."""
        counts = batch.request_counts
        new = {
            "batch_id": batch.id,
            "status": batch.status,
            "request_counts": (
                {"total": counts.total, "completed": counts.completed, "failed": counts.failed}
                if counts is not None
                else None
            ),
            "output_file_id": batch.output_file_id,
            "error_file_id": batch.error_file_id,
        }
        errors = getattr(batch.errors, "data", None) or []
        if errors:
            new["errors"] = [
                {"code": e.code, "message": e.message, "line": e.line} for e in errors[:20]
            ]
        if state is not None:
            new["state"] = state
        if any(rec.get(k) != v for k, v in new.items()):
            rec.update(new)
            self.ledger.save(rec)

    # ---- polling and results ----------------------------------------------------------
    async def _poll(
        self,
        claims: dict[str, set[str]],
        waiters: dict[str, list[tuple[Any, ChatRequest]]],
        retry: list[tuple[Any, ChatRequest]],
        attempts: dict[str, int],
    ) -> AsyncIterator[tuple[Any, ChatResult | RequestFailure]]:
        """Poll the claimed batches until each is final; hand over each one's outcomes as
        it ends, and put what should be sent again into ``retry``."""
        by_local = {r["local"]: r for r in self.records}
        active = [by_local[local] for local in claims]
        bars: dict[str, BatchProgress] = {}
        try:
            while active:
                for rec in list(active):
                    if rec["state"] != FINISHED:
                        batch = await self._call(
                            f"polling batch {rec['batch_id']}",
                            self.client.batches.retrieve,
                            rec["batch_id"],
                        )
                        self._update(rec, batch)
                        counts = rec.get("request_counts") or {}
                        bar = bars.get(rec["local"])
                        if bar is None:
                            bar = bars[rec["local"]] = BatchProgress(
                                rec["batch_id"], rec["requests"]
                            )
                        bar.update(
                            batch.status,
                            counts.get("completed", 0),
                            counts.get("failed", 0),
                            counts.get("total", 0),
                        )
                        if batch.status not in FINAL:
                            continue
                        await self._store(rec)
                    active.remove(rec)
                    for item in self._outcomes(rec, claims[rec["local"]], waiters, retry, attempts):
                        yield item
                    self._taken.append(rec)
                if active:
                    await asyncio.sleep(self.server.batch_poll_s)
        finally:
            for bar in bars.values():
                bar.close()

    async def _store(self, rec: dict[str, Any]) -> None:
        """A final batch's output and error files, kept beside its record; a failed batch
        (its file refused) stops the stage with the API's reason."""
        if rec["status"] == "failed":
            rec["state"] = FINISHED
            self.ledger.save(rec)
            why = "; ".join(
                f"{e.get('message') or e.get('code')}"
                + (f" (line {e['line']})" if e.get("line") is not None else "")
                for e in rec.get("errors") or []
            )
            raise BackendError(
                f"openai batch {rec['batch_id']} failed: {why or 'no reason given'}; its "
                f"requests are submitted again on the next run (record: "
                f"{self.ledger.folder / (rec['local'] + '.json')})"
            )
        for kind, field in (("output", "output_file_id"), ("errors", "error_file_id")):
            file_id = rec.get(field)
            if not file_id:
                continue
            content = await self._call(
                f"the download of {file_id}", self.client.files.content, file_id
            )
            with atomic_open(self.ledger.results(rec, kind), "wb") as fh:
                fh.write(content.content)
        rec["state"] = FINISHED
        self.ledger.save(rec)

    def _outcomes(
        self,
        rec: dict[str, Any],
        keys: set[str],
        waiters: dict[str, list[tuple[Any, ChatRequest]]],
        retry: list[tuple[Any, ChatRequest]],
        attempts: dict[str, int],
    ) -> list[tuple[Any, ChatResult | RequestFailure]]:
        """Every claimed request's outcome from a finished batch's stored files; lines to
        send again go to ``retry``."""
        expected = {k: waiters[k][0][1] for k in keys}
        got: dict[str, ChatResult | LineError] = {}
        for kind in ("output", "errors"):
            path = self.ledger.results(rec, kind)
            if path.is_file():
                source = f"batch {rec['batch_id']} {kind} file"
                text = path.read_text("utf-8", errors="replace")
                for key, outcome in read_lines(text, expected, source).items():
                    got.setdefault(key, outcome)
        status = rec.get("status")
        out: list[tuple[Any, ChatResult | RequestFailure]] = []
        for key in keys:
            outcome = got.get(key) or LineError(
                f"batch {status}: batch {rec['batch_id']} ended without answering it",
                resend=status != "cancelled",
            )
            if isinstance(outcome, ChatResult):
                try:
                    outcome = self.answer(expected[key], outcome)
                except (ValueError, UnusableReply) as exc:  # no answer in this dialect
                    outcome = LineError(f"batch unusable reply: {exc}", resend=True)
            if isinstance(outcome, ChatResult):
                out += [(token, outcome) for token, _ in waiters[key]]
                continue
            attempts[key] = attempts.get(key, 0) + 1
            if outcome.resend and status != "cancelled" and attempts[key] < self.max_attempts:
                retry.extend(waiters[key])
                continue
            failure = RequestFailure(outcome.reason, attempts[key], transient=outcome.resend)
            out += [(token, failure) for token, _ in waiters[key]]
        return out

    def _mark_taken(self) -> None:
        """The batches whose outcomes the runner has taken (it asked for more, or ended):
        their stored results no longer answer a later run, which asks anew."""
        for rec in self._taken:
            rec["delivered"] = True
            self.ledger.save(rec)
            for kind in ("output", "errors"):  # in the cache now: not kept twice
                self.ledger.results(rec, kind).unlink(missing_ok=True)
        self._taken.clear()
