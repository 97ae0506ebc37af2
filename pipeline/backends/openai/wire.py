"""The OpenAI-compatible wire, below the backend, its Batch API mode, its dialects and the
batch line format, which all read it: where requests go and with which credentials
(:func:`endpoint`), a reply body read as a result (:func:`parse_reply`), which errors are
worth a retry, what a server's refusal names, and whether the server can be reached."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import openai

from pipeline.backends.openai.ratelimit import retry_after
from pipeline.core.errors import BackendError
from pipeline.core.redact import public_url, redact, strip_userinfo
from pipeline.types.chat import ChatRequest, ChatResult, Choice

if TYPE_CHECKING:
    from pipeline.kinds.settings import OpenAISettings

_TRANSIENT_STATUS = {408, 409, 425, 429}

# A JSON body can escape a lone UTF-16 surrogate, which is not Unicode: it could not be
# stored as UTF-8 or sent on to the judge, so it becomes U+FFFD as the answer arrives.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_unicode(text: Any) -> Any:
    return _SURROGATE.sub("\ufffd", text) if isinstance(text, str) else text


@dataclass(frozen=True)
class Endpoint:
    """Where and how to send requests, from ``backend.openai.base_url`` and the API key."""

    base: str  # without user:password@ and without the query string
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # Authorization, when any
    sends: str = "nothing"  # "basic" (URL credentials), "key" ($api_key_env) or "nothing"

    def url(self, path: str) -> str:
        """``base`` + ``path``, with the query string."""
        url = self.base.rstrip("/") + path
        return f"{url}?{urlencode(self.query)}" if self.query else url


def endpoint(cfg: OpenAISettings) -> Endpoint:
    """Split ``cfg.base_url`` (``backend.openai``) into the address and the credentials
    written into it.

    The openai client neither accepts ``user:password@`` on aiohttp ("Cannot combine
    AUTHORIZATION header with AUTH argument") nor keeps a query string in its base URL
    (it appends the path after it), so both are taken out here and sent explicitly.
    """
    parts = urlsplit(cfg.base_url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    base = urlunsplit(parts._replace(netloc=netloc, query="", fragment=""))
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        basic = "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")
        return Endpoint(base, query, {"Authorization": basic}, "basic")
    key = os.environ.get(cfg.api_key_env)
    if key:
        return Endpoint(base, query, {"Authorization": f"Bearer {key}"}, "key")
    return Endpoint(base, query)


def auth_error(cfg: OpenAISettings, status: int, detail: str = "") -> BackendError:
    """The one line for a server that refused our credentials: which ones, and what to do."""
    ep = endpoint(cfg)
    where = public_url(cfg.base_url)
    verb = "refused" if status == 401 else "denied access to"
    said = f": {redact(' '.join(detail.split()))[:200]}" if detail else ""
    env = cfg.api_key_env
    # a credential in the query string is masked by public_url
    has_query_key = where != strip_userinfo(cfg.base_url)
    in_query = " (and the key in its query string)" if has_query_key else ""
    if ep.sends == "basic":
        what = f"the user name and password in backend.openai.base_url{in_query}"
        todo = "fix them in backend.openai.base_url"
    elif ep.sends == "key":
        what = f"the API key in ${env}{in_query}"
        todo = (
            f"set {env} to a key this server accepts (backend.openai.api_key_env names the "
            "variable)"
        )
    elif has_query_key:
        what = "the key in backend.openai.base_url's query string"
        todo = f"fix that key, or put a valid one in ${env} (backend.openai.api_key_env)"
    else:
        what = f"the request without an API key (${env} is not set)"
        todo = (
            f"export {env}=<your key>, or set backend.openai.api_key_env to the variable "
            "that holds it"
        )
    if status == 403:
        todo += "; a key without access to this model or endpoint is refused the same way"
    return BackendError(f"the server at {where} {verb} {what} (HTTP {status}{said}); {todo}")


class _EmptyAnswer(Exception):
    """The server answered 200 without usable choices; treated as transient."""


# the public name of the same error, for readers of replies outside this module
UnusableReply = _EmptyAnswer


def _reply_choice(c: dict[str, Any]) -> Choice:
    """One reply choice. A server with a reasoning parser (``vllm serve --reasoning-parser``)
    returns a reasoning model's reasoning apart, as ``reasoning`` (vLLM 0.26) or
    ``reasoning_content`` (older vLLM, DeepSeek's API); its content is then the answer
    alone, and null when the reasoning used every token (pipeline/backends/reasoning.py)."""
    message = c["message"]
    finish = c.get("finish_reason") or "stop"
    reasoning = message.get("reasoning")
    if not isinstance(reasoning, str):
        reasoning = message.get("reasoning_content")
    content = message["content"]
    if not isinstance(reasoning, str):
        return Choice(_valid_unicode(content), finish)
    text = _valid_unicode(content) if content is not None else ""
    cut = finish == "length" and not (text or "").strip()
    return Choice(text, finish, _valid_unicode(reasoning), reasoning_cut=cut)


def parse_reply(resp: Any, req: ChatRequest) -> ChatResult:
    """A chat-completions reply body (a dict) as a :class:`ChatResult`; raises
    :data:`UnusableReply` when it holds no usable answer. The live backend reads every
    reply with it, and so do batch results (pipeline/backends/openai/lines.py): one reading."""
    try:
        choices = [_reply_choice(c) for c in resp["choices"]]
        usage = resp.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("completion_tokens_details") or {}
        reasoning_tokens = (
            int(details.get("reasoning_tokens") or 0) if isinstance(details, dict) else 0
        )
        model = resp.get("model") or req.model
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise _EmptyAnswer(f"the server's reply has no usable choices ({exc!r})") from None
    if not choices or any(not isinstance(c.text, str) for c in choices):
        raise _EmptyAnswer("the server returned no content")
    reasoned = [c for c in choices if c.reasoning is not None]
    if reasoning_tokens and len(reasoned) == 1:  # the server's own count (OpenAI's usage)
        reasoned[0].reasoning_tokens = min(reasoning_tokens, completion_tokens or reasoning_tokens)
    return ChatResult(choices, prompt_tokens, completion_tokens, str(model))


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIStatusError):
        # llama-cpp-python refuses a response_format it does not take with a 500: a
        # refusal of our body, which no retry changes (pipeline/backends/openai/dialects.py)
        if exc.status_code >= 500 and refusal_of(exc) is not None:
            return False
        return exc.status_code in _TRANSIENT_STATUS or exc.status_code >= 500
    # APITimeoutError is an APIConnectionError; a body that is not JSON surfaces as a
    # decode or validation error and is a server glitch, not the request's fault.
    return isinstance(
        exc,
        (
            openai.APIConnectionError,
            openai.APIResponseValidationError,
            json.JSONDecodeError,
            _EmptyAnswer,
        ),
    )


def retry_after_seconds(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (Retry-After / retry-after-ms), if it did."""
    response = getattr(exc, "response", None)
    if response is None:
        return None
    return retry_after(response.headers)


def describe_error(exc: BaseException) -> str:
    """One line for the errors table and logs; a server may echo the key back (a 401
    "Incorrect API key provided: sk-..."), so the text is redacted before it is cut."""
    if isinstance(exc, openai.APIStatusError):
        text = f"HTTP {exc.status_code}: {exc.message}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return redact(" ".join(text.split()))[:500]


# ---- refusals ----------------------------------------------------------------------------

# words a server uses when it refuses a field or a value of it
_REFUSING = re.compile(
    r"unsupported|not supported|does not support|doesn't support|only supports?|"
    r"unrecogni[sz]ed|unknown (?:field|parameter|argument|key)|not allowed|not permitted|"
    r"extra (?:inputs|fields)|input should be|must be|should be|is not one of|invalid|"
    r"not (?:a )?valid|cannot be|can't be|not available",
    re.I,
)
_STRUCTURED_WORDS = re.compile(
    r"response_format|json_schema|json_object|structured output|additionalProperties|"
    r"\bschema\b|\bstrict\b",
    re.I,
)
_N_WORDS = re.compile(
    r"(?:['\"`]n['\"`])|(?:\bn\s*(?:>|must|should|is|=|can)\b)|(?:parameter n\b)|"
    r"(?:\bn\s*>\s*1)|(?:number of (?:choices|completions))",
    re.I,
)
_SEED_WORDS = re.compile(r"['\"`]?\bseed\b['\"`]?", re.I)
_MAX_TOKENS_WORDS = re.compile(r"['\"`]?\bmax_tokens\b['\"`]?", re.I)
# a max_tokens that is too large is a limit, not a refused parameter
_TOO_LARGE = re.compile(r"too large|maximum context|context length|at most \d+ completion", re.I)


def refused_feature(status: int, message: str, param: str | None = None) -> str | None:
    """Which part of our body a server refused: "structured_output", "max_tokens", "n",
    "seed", or None when the refusal (or error) is about something else."""
    if status not in (400, 422, 500, 501):
        return None
    text = message or ""
    p = (param or "").strip().lower()
    if p.startswith("response_format"):
        return "structured_output"
    if p in ("max_tokens", "n", "seed"):
        return p
    if not _REFUSING.search(text):
        return None
    if _STRUCTURED_WORDS.search(text):
        return "structured_output"
    if _MAX_TOKENS_WORDS.search(text) and not _TOO_LARGE.search(text):
        return "max_tokens"
    if _SEED_WORDS.search(text):
        return "seed"
    if _N_WORDS.search(text):
        return "n"
    return None


_PYDANTIC_LOC = re.compile(r"'loc': \(([^)]*)\)")
_PYDANTIC_MSG = re.compile(r"""'msg': (?:"([^"]*)"|'([^']*)')""")


def short_message(message: str) -> str:
    """A server's error in a few words: a pydantic validation error (llama-cpp-python's
    500s) as "response_format.type: Input should be 'text' or 'json_object'"."""
    msg = _PYDANTIC_MSG.search(message)
    if msg is None:
        return " ".join(message.split())
    loc = _PYDANTIC_LOC.search(message)
    parts = [p.strip(" '\"") for p in (loc.group(1).split(",") if loc else [])]
    where = ".".join(p for p in parts if p and p != "body")
    text = msg.group(1) if msg.group(1) is not None else msg.group(2)
    return f"{where}: {text}" if where else text


def error_text(exc: BaseException) -> str:
    """The server's own message in an ``openai.APIStatusError`` (its ``message`` is "Error
    code: 400 - " and the whole body)."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    return str(getattr(exc, "message", "") or exc)


def refusal_of(exc: BaseException) -> str | None:
    """:func:`refused_feature` of an ``openai.APIStatusError`` (None for anything else)."""
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        return None
    return refused_feature(status, error_text(exc), getattr(exc, "param", None))


# how long the first ask of /models waits: a server that is up answers it at once
MODELS_FIRST_WAIT_S = 10.0


def _unreachable(cfg: OpenAISettings, exc: BaseException) -> BackendError:
    return BackendError(
        f"cannot reach the OpenAI-compatible server at {public_url(cfg.base_url)} "
        f"({redact(str(exc))}); start it (`vllm serve MODEL`, `python -m llama_cpp.server "
        "--model FILE.gguf`, ...) or fix backend.openai.base_url"
    )


def _timed_out(exc: BaseException) -> bool:
    reason = getattr(exc, "reason", exc)
    return isinstance(reason, TimeoutError) or "timed out" in str(reason)


def _ask_models(cfg: OpenAISettings) -> bytes:
    """The body of ``GET /models``, asked with the requests' own address and credentials.

    A server that takes the connection but does not answer within MODELS_FIRST_WAIT_S is
    busy, not down (llama-cpp-python's server answers one request at a time, so /models
    waits behind a generation): it is asked again with the requests' own timeout before
    anything is said. HTTPError goes to the caller; not reachable, or still silent, is one
    BackendError saying which."""
    import urllib.error
    import urllib.request

    ep = endpoint(cfg)
    req = urllib.request.Request(ep.url("/models"), headers=ep.headers)
    waits = [min(cfg.timeout_s, MODELS_FIRST_WAIT_S)]
    if cfg.timeout_s > waits[0]:
        waits.append(cfg.timeout_s)
    for i, wait in enumerate(waits):
        try:
            with urllib.request.urlopen(req, timeout=wait) as resp:
                return bytes(resp.read(4_000_000))
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, OSError, ValueError) as exc:
            if not _timed_out(exc):
                raise _unreachable(cfg, exc) from None
            if i + 1 < len(waits):
                continue
            raise BackendError(
                f"the server at {public_url(cfg.base_url)} took the connection but did not "
                f"answer /models within {wait:g} s: it is busy (a server that answers one "
                "request at a time, such as llama-cpp-python's, is still generating); wait "
                "for it, or raise backend.openai.timeout_s"
            ) from None
    raise AssertionError("unreachable")  # the loop returns or raises


def check_reachable(cfg: OpenAISettings) -> None:
    """Fail fast with a clear message when the server cannot be reached at all."""
    import urllib.error

    try:
        _ask_models(cfg)
    except urllib.error.HTTPError as exc:
        # it answered. 401: the credentials are refused, and every request would be too.
        # Anything else (a 404 from a server without /models, a 403 for a key that may
        # chat but not list models) is the request path's business.
        if exc.code == 401:
            detail = ""
            with contextlib.suppress(OSError):
                detail = _error_text(exc.read().decode("utf-8", "replace"))
            raise auth_error(cfg, 401, detail) from None
        return


def list_models(cfg: OpenAISettings) -> list[dict[str, Any]]:
    """The server's ``/models`` entries (id, root, owned_by...), for the run's record of
    what served its answers; empty when the server has no such list (a 404, or a key that
    may chat but not list models). Raises BackendError when the server cannot be reached
    or refuses the credentials."""
    import urllib.error

    try:
        raw = _ask_models(cfg)
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            detail = ""
            with contextlib.suppress(OSError):
                detail = _error_text(exc.read().decode("utf-8", "replace"))
            raise auth_error(cfg, 401, detail) from None
        return []
    try:
        body = json.loads(raw)
    except ValueError:
        return []
    data = body.get("data") if isinstance(body, dict) else None
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []


def _error_text(body: str) -> str:
    """The message of an OpenAI-style error body, else the start of the body."""
    try:
        err = json.loads(body).get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    except (ValueError, AttributeError):
        pass
    return body.strip()[:200]
