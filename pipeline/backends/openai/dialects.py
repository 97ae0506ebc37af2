"""What one OpenAI-compatible server accepts: its structured-output dialect and sampling
parameters (the openai backend's ``backend.openai.structured_output``).

Servers differ in what they take in a chat request. OpenAI takes ``response_format``
``json_schema`` (the schema a hint) and, with ``strict``, enforces a subset of JSON Schema;
llama-cpp-python refuses ``json_schema`` ("Input should be 'text' or 'json_object'") and
takes ``json_object`` with the schema beside it; others take only ``json_object``, or
ignore ``response_format``. Newer OpenAI models refuse ``max_tokens`` (they want
``max_completion_tokens``); some servers refuse or ignore ``n`` > 1, some refuse ``seed``.

A :class:`Dialect` turns a request into the body (or, where ``n`` > 1 is not served, the
bodies) such a server takes, and its answers back into what the runner validates. The
request itself, its cache key and its full schema never change: every answer is checked
against the full schema on our side (pipeline/types/schemas.py) and re-asked as always. What a
dialect leaves out of ``response_format`` is stated in the prompt instead.

``auto`` asks the server once per run, with a small request shaped like the run's own
(a schema with the keywords the stages use, ``n`` = 2, a seed), and steps along the
fallbacks its refusals name (:func:`probe`). What it found is kept in the run's cache, so
the next invocation does not ask again, and what differs from the body every server took
before is recorded in the backend's identity (:func:`identify`): a server that takes
today's body keeps the identity, and so the cache keys, it always had.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.backends.identity import plain_url
from pipeline.backends.openai.wire import (
    auth_error,
    endpoint,
    error_text,
    refused_feature,
    short_message,
)
from pipeline.core.errors import BackendError, CacheError, ConfigError
from pipeline.core.ids import content_hash
from pipeline.core.redact import redact
from pipeline.kinds.dialect import (
    DIALECTS,
    SETTING,
    StructuredOutput,
    next_in_probe,
    probe_order,
    prompt_only,
)
from pipeline.types.chat import ChatRequest, ChatResult

if TYPE_CHECKING:
    from pipeline.kinds.settings import OpenAISettings

# bumped when the probe changes what it can find: a run asks the server again
PROBE_VERSION = 1

# Keywords OpenAI's strict mode refuses or documents as unsupported for some models (its
# "Supported schemas" page: the list for fine-tuned models is the strictest); a strict
# dialect moves them out of the schema and states them in the prompt instead.
STRICT_UNSUPPORTED = frozenset(
    {
        "minLength", "maxLength", "pattern", "format",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "patternProperties", "unevaluatedProperties", "propertyNames",
        "minProperties", "maxProperties",
        "unevaluatedItems", "contains", "minContains", "maxContains",
        "minItems", "maxItems", "uniqueItems",
        "allOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
    }
)  # fmt: skip


# ---- the dialects (pipeline/kinds/dialect.py: what one is; DIALECTS names them) ---------


class JsonSchema(StructuredOutput):
    """The schema in ``response_format`` (a hint to OpenAI, a grammar to vLLM)."""

    probe_rank = 10
    enforced = sends_schema = True
    summary = "the schema in response_format"

    @classmethod
    def apply(cls, req: ChatRequest, body: dict[str, Any], schema_name: str) -> None:
        return  # the request's own body

    @classmethod
    def note(cls, req: ChatRequest) -> str:
        return ""


class JsonSchemaStrict(StructuredOutput):
    """OpenAI's strict mode: the keywords it refuses move from the schema to the prompt."""

    probe_rank = 20
    enforced = sends_schema = True
    summary = "OpenAI's strict mode"

    @classmethod
    def apply(cls, req: ChatRequest, body: dict[str, Any], schema_name: str) -> None:
        schema = strict_schema(req.json_schema or {})[0]
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": schema_name, "strict": True, "schema": schema},
        }

    @classmethod
    def note(cls, req: ChatRequest) -> str:
        moved = strict_schema(req.json_schema or {})[1]
        if not moved:
            return ""
        return (
            "Besides the JSON schema given with this request, the JSON object must keep to "
            "these limits:\n" + "\n".join(f"- {m}" for m in moved)
        )


class JsonObjectSchema(StructuredOutput):
    """``json_object`` with the schema beside it (llama-cpp-python's server)."""

    probe_rank = 30
    sends_schema = True
    summary = "json_object with the schema beside it: llama-cpp-python"

    @classmethod
    def apply(cls, req: ChatRequest, body: dict[str, Any], schema_name: str) -> None:
        body["response_format"] = {"type": "json_object", "schema": req.json_schema or {}}

    @classmethod
    def note(cls, req: ChatRequest) -> str:
        return schema_statement(req.json_schema or {})


class JsonObject(StructuredOutput):
    """``json_object`` only; the schema is stated in the prompt."""

    probe_rank = 40
    summary = "json_object, the schema in the prompt"

    @classmethod
    def apply(cls, req: ChatRequest, body: dict[str, Any], schema_name: str) -> None:
        body["response_format"] = {"type": "json_object"}

    @classmethod
    def note(cls, req: ChatRequest) -> str:
        return schema_statement(req.json_schema or {})


class PromptOnly(StructuredOutput):
    """No ``response_format`` at all: the schema stated in the prompt only (the last
    resort, for a server that refuses or ignores every other)."""

    probe_rank = 50
    summary = "the schema stated in the prompt only"

    @classmethod
    def apply(cls, req: ChatRequest, body: dict[str, Any], schema_name: str) -> None:
        body.pop("response_format", None)

    @classmethod
    def note(cls, req: ChatRequest) -> str:
        return schema_statement(req.json_schema or {})


@dataclass(frozen=True)
class Dialect:
    """How to ask one server for one model. The defaults are the body every request had
    before dialects existed."""

    structured_output: str = "json_schema"
    max_tokens: str = "max_tokens"  # or "max_completion_tokens"
    n: str = "n"  # or "split": n requests of one choice each, with distinct seeds
    seed: str = "seed"  # or "dropped"

    def record(self) -> dict[str, str]:
        """What differs from the defaults: empty for today's body (then nothing is added
        to the identity, and the cache keys stay what they were)."""
        default = Dialect()
        return {k: v for k, v in asdict(self).items() if getattr(default, k) != v}

    @classmethod
    def from_record(cls, data: Any) -> Dialect | None:
        if not isinstance(data, dict):
            return None
        try:
            d = cls(**{k: str(v) for k, v in data.items() if k in cls.__dataclass_fields__})
        except TypeError:
            return None
        ok = (
            d.structured_output in DIALECTS
            and d.max_tokens in ("max_tokens", "max_completion_tokens")
            and d.n in ("n", "split")
            and d.seed in ("seed", "dropped")
        )
        return d if ok else None

    def describe(self) -> str:
        parts = [f"structured output {self.structured_output}"]
        if self.max_tokens != "max_tokens":
            parts.append(self.max_tokens)
        if self.n == "split":
            parts.append("n > 1 as single requests")
        if self.seed == "dropped":
            parts.append("no seed")
        return ", ".join(parts)

    # ---- requests --------------------------------------------------------------------
    def bodies(self, req: ChatRequest) -> list[dict[str, Any]]:
        """The request body, or ``req.n`` bodies of one choice each where ``n`` > 1 is not
        served. Today's dialect sends ``req.openai_body()`` itself."""
        body = req.openai_body()
        if self == _DEFAULT:
            return [body]
        if req.json_schema is not None:
            self._structured(req, body)
        if self.max_tokens != "max_tokens":
            body[self.max_tokens] = body.pop("max_tokens")
        if self.seed == "dropped":
            body.pop("seed", None)
        if self.n != "split" or req.n <= 1:
            return [body]
        out = []
        for i in range(req.n):
            one = {k: v for k, v in body.items() if k != "n"}
            if self.seed != "dropped":
                one["seed"] = split_seed(req, i)
            out.append(one)
        return out

    def as_sent(self, req: ChatRequest) -> list[ChatRequest]:
        """``req`` as the server receives it, one request per body of :meth:`bodies`: the
        schema's note in its system message, and ``n`` > 1 split into ``n`` of one choice.
        What its prompt tokens and bounds are counted on (``prb plan``, ``run.budget``):
        a split request's prompt is paid once per choice."""
        if self == _DEFAULT:
            return [req]
        one = req
        note = self.note(req) if req.json_schema is not None else ""
        if note:
            messages = with_system_note(req.message_dicts(), note)
            one = replace(req, messages=tuple((m["role"], m["content"]) for m in messages))
        if self.n == "split" and req.n > 1:
            return [replace(one, n=1)] * req.n
        return [one]

    @property
    def kind(self) -> type[StructuredOutput]:
        """This dialect's structured-output class (DIALECTS)."""
        return DIALECTS.get(self.structured_output)

    def note_for_schema(self) -> bool:
        """Whether a request with a schema may get text in its prompt: every kind but one
        the server is held to without a word (strict only where its schema has limits
        strict mode cannot carry)."""
        return self.kind is not JsonSchema

    def note(self, req: ChatRequest) -> str:
        """What this dialect adds to the system message of a request with a schema."""
        return self.kind.note(req)

    def _structured(self, req: ChatRequest, body: dict[str, Any]) -> None:
        self.kind.apply(req, body, _schema_name(req.schema_name))
        note = self.note(req)
        if note:
            body["messages"] = with_system_note(body["messages"], note)

    # ---- answers ---------------------------------------------------------------------
    def answer(self, req: ChatRequest, result: ChatResult) -> ChatResult:
        """The answer as the runner validates it: where the server is not held to the
        schema, the JSON object is taken out of the text around it (prose, a code fence);
        text that holds none is left as it is, and the validator asks again."""
        if req.json_schema is None or self.kind.enforced:
            return result
        for c in result.choices:
            c.text = json_in_text(c.text)
        return result


_DEFAULT = Dialect()


def only_todays_body(cfg: OpenAISettings) -> str | None:
    """For an engine that sends each request's own body and no other (the ray backend's
    http engine): the dialect it sends, when ``cfg`` asks for another one (``auto`` is
    left to find that one), else None."""
    s = cfg.structured_output
    return None if s in ("auto", _DEFAULT.structured_output) else _DEFAULT.structured_output


def split_seed(req: ChatRequest, i: int) -> int:
    """The seed of choice ``i`` of a request split into single ones: derived from the
    request's seed (or, without one, its key), distinct per choice, the same on every run."""
    base = str(req.seed) if req.seed is not None else req.key
    digest = hashlib.sha256(f"{base}:{i}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def merge(parts: Sequence[ChatResult]) -> ChatResult:
    """The answers of a split request as one result, choices in order."""
    return ChatResult(
        [c for p in parts for c in p.choices],
        sum(p.prompt_tokens for p in parts),
        sum(p.completion_tokens for p in parts),
        parts[0].model if parts else "",
    )


def _schema_name(name: str) -> str:
    # OpenAI: a-z, A-Z, 0-9, underscores and dashes, at most 64 characters
    return re.sub(r"[^A-Za-z0-9_-]", "_", name or "answer")[:64] or "answer"


# ---- schemas -----------------------------------------------------------------------------


def _limit(key: str, value: Any) -> str:
    words = {
        "maxLength": f"at most {value} characters",
        "minLength": f"at least {value} characters",
        "maxItems": f"at most {value} items",
        "minItems": f"at least {value} items",
        "maximum": f"at most {value}",
        "minimum": f"at least {value}",
        "exclusiveMaximum": f"below {value}",
        "exclusiveMinimum": f"above {value}",
        "multipleOf": f"a multiple of {value}",
        "pattern": f"matching the regular expression {json.dumps(value)}",
        "format": f"in {value} format",
        "uniqueItems": "no item repeated" if value else "",
        "maxProperties": f"at most {value} fields",
        "minProperties": f"at least {value} fields",
    }
    return words.get(key, f"{key} {json.dumps(value, sort_keys=True)}")


def strict_schema(schema: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``schema`` as OpenAI's strict mode takes it: every object with all its properties
    required and no others allowed, the keywords strict mode refuses taken out. Returns
    the schema and the limits taken out, one line each ("answer.x: at most 40 characters"),
    for the prompt. A property made required is still valid against the full schema."""
    moved: list[str] = []

    def walk(node: Any, where: str) -> Any:
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        limits = []
        for key, value in node.items():
            if key in STRICT_UNSUPPORTED:
                said = _limit(key, value)
                if said:
                    limits.append(said)
            elif key == "properties" and isinstance(value, dict):
                out[key] = {k: walk(v, f"{where}.{k}") for k, v in value.items()}
            elif key == "items":
                out[key] = walk(value, f"{where}[]")
            elif key in ("anyOf", "oneOf") and isinstance(value, list):
                out[key] = [walk(v, where) for v in value]
            elif key in ("$defs", "definitions") and isinstance(value, dict):
                out[key] = {k: walk(v, f"{k}") for k, v in value.items()}
            else:
                out[key] = value
        if limits:
            moved.append(f"{where}: {', '.join(limits)}")
        if node.get("type") == "object" or "properties" in node:
            props = out.get("properties") or {}
            out["properties"] = props
            out["required"] = list(props)
            out["additionalProperties"] = False
        return out

    return walk(schema, "answer"), moved


def schema_statement(schema: dict[str, Any]) -> str:
    """The schema stated in the prompt, for a server not held to it (json_object, none)."""
    return (
        "Reply with only a JSON object, and no other text, that is valid against this JSON "
        "Schema (it gives every field's type, allowed values and length limits):\n"
        + json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    )


def with_system_note(messages: list[dict[str, Any]], note: str) -> list[dict[str, Any]]:
    """``messages`` with ``note`` added to the system message (one is put first when
    there is none): the request's own turns, and so a re-ask's, stay as they are."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{note}".lstrip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]


_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n(.*?)```", re.S)
_DECODER = json.JSONDecoder(strict=False)


def json_in_text(text: str) -> str:
    """The JSON object in ``text``: the text itself when it is one, else the first code
    fence holding one, else the first object found in the text, as written there (the
    validator checks it); ``text`` unchanged when it holds none."""
    if not isinstance(text, str):
        return text
    stripped = text.strip()
    if _is_object(stripped):
        return stripped
    for m in _FENCE.finditer(text):
        inner = m.group(1).strip()
        if _is_object(inner):
            return inner
    start = text.find("{")
    while start != -1:
        try:
            value, end = _DECODER.raw_decode(text, start)
        except ValueError:
            value, end = None, start
        if isinstance(value, dict):
            return text[start:end]
        start = text.find("{", start + 1)
    return text


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text, strict=False), dict)
    except ValueError:
        return False


class DialectRefused(BackendError):
    """A server refused a part of the body this run found it takes, or was told it takes."""


def refusal_error(cfg: OpenAISettings, model: str, dialect: Dialect, exc: BaseException,
                  feature: str, cache_path: Path | None) -> DialectRefused:  # fmt: skip
    """The line a stage stops with when the server refuses our body mid-run (every other
    request would be refused the same way): what it refused, and what to do. Under auto the
    run's record of what the server takes is dropped, so the next run asks it again."""
    status = getattr(exc, "status_code", "?")
    said = redact(short_message(error_text(exc)))[:200]
    what = {
        "structured_output": f"structured output {dialect.structured_output}",
        "max_tokens": dialect.max_tokens,
        "n": "n > 1",
        "seed": "seed",
    }[feature]
    where = f"the server at {plain_url(cfg.base_url)} refused {what} for model {model}"
    later = next_in_probe(dialect.structured_output) or prompt_only()
    if cfg.structured_output == "auto":
        forget(cfg, model, cache_path)
        todo = (
            "it took it when this run first asked; that record is dropped, so running the "
            f"same command again asks the server anew (or set {SETTING} to {later})"
        )
    elif feature == "structured_output":
        todo = f"set {SETTING} to auto (the run finds what the server takes) or to {later}"
    else:
        todo = f"set {SETTING} to auto: the run then finds what the server takes"
    return DialectRefused(f"{where} (HTTP {status}: {said}); {todo}")


# ---- the probe -----------------------------------------------------------------------------

# A small request shaped like the run's: a closed schema with the keywords the stages'
# schemas use (pipeline/types/schemas.py, rubrics/rubric.schema.json), n = 2 and a seed. The
# prompt does not ask for JSON, so a server that ignores response_format shows it.
PROBE_SCHEMA: dict[str, Any] = {
    "title": "Probe",
    "type": "object",
    "properties": {
        "score": {"type": "integer", "enum": [1, 2, 3]},
        "colour": {"type": "string", "minLength": 3, "maxLength": 20},
        "words": {
            "type": "array",
            "minItems": 1,
            "maxItems": 2,
            "items": {
                "type": "object",
                "properties": {"word": {"type": "string", "maxLength": 12}},
                "required": ["word"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["score", "colour", "words"],
    "additionalProperties": False,
}
PROBE_PROMPT = "Name one colour."
# room for the longest answer the probe schema allows (84 characters), twice over
PROBE_MAX_TOKENS = 192
PROBE_STEPS = 8


def probe_request(model: str) -> ChatRequest:
    return ChatRequest(
        messages=(("user", PROBE_PROMPT),),
        model=model,
        temperature=0.0,
        max_tokens=PROBE_MAX_TOKENS,
        n=2,
        seed=0,
        json_schema=PROBE_SCHEMA,
        schema_name="probe",
    )


def _post(cfg: OpenAISettings, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(HTTP status, the JSON reply or the error object); status 0 when nothing came back."""
    import urllib.error
    import urllib.request

    ep = endpoint(cfg)
    data = json.dumps(body).encode("utf-8")
    headers = {**ep.headers, "Content-Type": "application/json"}
    req = urllib.request.Request(ep.url("/chat/completions"), data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=cfg.timeout_s) as resp:
            reply = json.loads(resp.read(16_000_000))
            return resp.status, reply if isinstance(reply, dict) else {}
    except urllib.error.HTTPError as exc:
        text = ""
        with contextlib.suppress(OSError):
            text = exc.read(1_000_000).decode("utf-8", "replace")
        err: Any = {}
        with contextlib.suppress(ValueError):
            err = json.loads(text)
        if isinstance(err, dict) and isinstance(err.get("error"), dict):
            err = err["error"]
        elif isinstance(err, dict) and "detail" in err:  # FastAPI's own 422 body
            err = {"message": json.dumps(err["detail"])[:2000]}
        if not isinstance(err, dict) or not err.get("message"):
            err = {"message": text.strip()[:2000]}
        return exc.code, err
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return 0, {"message": f"{type(exc).__name__}: {exc}"}


@dataclass
class Probed:
    dialect: Dialect
    said: str  # what was found, for the line on stderr
    final: bool = True  # False: nothing could be learnt (kept for this process only)
    kept: bool = False  # in the run's cache already


def probe(cfg: OpenAISettings, model: str, first: Dialect) -> Probed:
    """Ask the server, with :func:`probe_request`, what it takes, starting from ``first``
    and following its refusals: structured output in ``probe_rank`` order (auto only),
    ``max_completion_tokens`` for a refused ``max_tokens``, single requests for a refused
    or ignored ``n`` > 1, no seed for a refused one. An explicit structured output the
    server refuses is a ConfigError; a server that cannot say (down, another error) leaves
    ``first`` as it is."""
    auto = cfg.structured_output == "auto"
    d, notes, transient = first, [], 0
    for _ in range(PROBE_STEPS + 3):
        status, reply = _post(cfg, d.bodies(probe_request(model))[0])
        if status == 200:
            raw = reply.get("choices")
            choices: list[Any] = raw if isinstance(raw, list) else []
            texts = [
                ((c.get("message") or {}).get("content"), c.get("finish_reason"))
                for c in choices
                if isinstance(c, dict)
            ]
            ignored = (
                DIALECTS.get(d.structured_output).sends_schema
                and bool(texts)
                and all(f == "stop" and isinstance(t, str) for t, f in texts)
                and not any(_is_object(t.strip()) for t, _ in texts if isinstance(t, str))
            )
            if d.n == "n" and len(texts) < 2:
                d = replace(d, n="split")
                notes.append(f"n = 2 answered with {len(texts)} choice(s)")
            if ignored and auto:
                notes.append(f"{d.structured_output} answered with free text")
                d = replace(d, structured_output=prompt_only())
                continue
            break
        if status == 401 or status == 403:
            raise auth_error(cfg, status, str(reply.get("message") or ""))
        message = str(reply.get("message") or "")
        feature = refused_feature(status, message, reply.get("param"))
        said = f"HTTP {status}: {redact(short_message(message))[:100]}"
        if feature is None:
            transient += 1
            if (status == 0 or status == 429 or status >= 500) and transient < 3:
                time.sleep(0.5 * 2**transient)
                continue
            return Probed(first, f"could not find out what it takes ({said})", final=False)
        if feature == "structured_output":
            nxt = next_in_probe(d.structured_output)
            if not auto:
                raise ConfigError(
                    f"the server at {_url(cfg)} refuses structured output "
                    f"{d.structured_output} for model {model} ({said}); set it to auto (the "
                    "run finds what the server takes) or to "
                    f"{nxt or 'another dialect'}",
                    field=SETTING,
                )
            if nxt is None:
                return Probed(first, f"it refused every structured output ({said})", False)
            notes.append(f"{d.structured_output} refused ({said})")
            d = replace(d, structured_output=nxt)
        elif feature == "max_tokens" and d.max_tokens == "max_tokens":
            notes.append(f"max_tokens refused ({said})")
            d = replace(d, max_tokens="max_completion_tokens")
        elif feature == "n" and d.n == "n":
            notes.append(f"n = 2 refused ({said})")
            d = replace(d, n="split")
        elif feature == "seed" and d.seed == "seed":
            notes.append(f"seed refused ({said})")
            d = replace(d, seed="dropped")
        else:
            return Probed(first, f"could not find out what it takes ({said})", final=False)
    else:
        return Probed(first, "could not find out what it takes (too many refusals)", False)
    why = f" ({'; '.join(notes)})" if notes else ""
    return Probed(d, f"takes {d.describe()}{why}")


def _url(cfg: OpenAISettings) -> str:
    return plain_url(cfg.base_url)


# ---- once per run ----------------------------------------------------------------------------

_SENDING = contextvars.ContextVar("dialect_probe_allowed", default=True)
# (cache path, url, model, setting) -> what this process found or read
_FOUND: dict[tuple[str, str, str, str], Probed] = {}
# (server URL, model) whose dialect a plan could not know: auto, never asked, no record
_NOT_KNOWN: dict[tuple[str, str], None] = {}


@contextlib.contextmanager
def planning(schemas: Callable[[], list[dict[str, Any]]]) -> Iterator[list[str]]:
    """Inside: what a server takes is read from a run's record only, never asked (``prb
    plan`` sends nothing: ``Backend.planning``). The list it yields gets, on leaving, a
    note for the servers whose dialect it could not know (auto, never asked, no record),
    counted with today's body: their prompts may hold each of ``schemas`` too."""
    _NOT_KNOWN.clear()
    notes: list[str] = []
    token = _SENDING.set(False)
    try:
        yield notes
    finally:
        _SENDING.reset(token)
    if _NOT_KNOWN:
        url, _ = next(iter(_NOT_KNOWN))
        models = ", ".join(repr(m) for _, m in _NOT_KNOWN)
        extra = max((len(schema_statement(s)) for s in schemas()), default=0) // 4
        notes.append(
            f"what the server at {url} takes for JSON requests with {models} is not known "
            "yet (backend.openai.structured_output: auto asks it at the first run's first "
            "request): counted as today's body. A server that takes only json_object or no "
            "response_format (llama-cpp-python's, some providers) is also sent each schema "
            f"in the system message, up to about {extra:,} prompt tokens more a JSON request, "
            "so a run.budget.tokens set from this plan can stop the run early; set "
            "backend.openai.structured_output to what the server takes to count it exactly"
        )


def _memo_key(cfg: OpenAISettings, model: str) -> str:
    where = {"url": _url(cfg), "model": model, "setting": cfg.structured_output}
    return content_hash({**where, "probe": PROBE_VERSION, "kind": "dialect"})


def _recorded(cache_path: Path | None, key: str) -> Dialect | None:
    if cache_path is None or not Path(cache_path).is_file():
        return None
    from pipeline.run.cache import RequestCache

    try:
        with RequestCache(cache_path, readonly=True) as cache:
            return Dialect.from_record(cache.get_derived(key))
    except (CacheError, OSError):
        return None


def _fixed(cfg: OpenAISettings) -> Dialect:
    """The dialect before asking: the setting's structured output, today's parameters."""
    s = cfg.structured_output
    return Dialect(structured_output=probe_order()[0] if s == "auto" else s)


def resolve(
    cfg: OpenAISettings, model: str, cache_path: Path | None, *, standin: bool = False
) -> Dialect:
    """What the server at ``cfg.base_url`` takes for ``model``: found once per run (this
    process's memo, then the run's cache, then :func:`probe`, which says what it found in
    one line on stderr). The project's stand-in takes every body and is never asked; a
    plan (:func:`planning`) reads records only."""
    if standin:
        return _fixed(cfg)
    memo = (str(cache_path), _url(cfg), model, cfg.structured_output)
    hit = _FOUND.get(memo)
    if hit is not None:
        return hit.dialect
    recorded = _recorded(cache_path, _memo_key(cfg, model))
    if recorded is not None:
        _FOUND[memo] = Probed(recorded, "recorded", kept=True)
        return recorded
    if not _SENDING.get():
        if cfg.structured_output == "auto":
            _NOT_KNOWN[(_url(cfg), model)] = None
        return _fixed(cfg)
    found = probe(cfg, model, _fixed(cfg))
    _FOUND[memo] = found
    if cache_path is not None and Path(cache_path).is_file():
        keep(cfg, cache_path)  # a run begun before: kept now (a done run builds no backend)
    then = "recorded with the run's identity" if found.final else "sending "
    then += "" if found.final else found.dialect.describe()
    print(f"backend.openai: the server at {_url(cfg)} (model {model}) {found.said}; {then}",
          file=sys.stderr, flush=True)  # fmt: skip
    return found.dialect


def known(cfg: OpenAISettings, model: str, cache_path: Path | None) -> Dialect:
    """The dialect :func:`resolve` found for this run, without asking anyone (the backend
    sends what the identity recorded); the setting's own when nothing was found."""
    memo = (str(cache_path), _url(cfg), model, cfg.structured_output)
    hit = _FOUND.get(memo)
    if hit is not None:
        return hit.dialect
    recorded = _recorded(cache_path, _memo_key(cfg, model))
    return recorded if recorded is not None else _fixed(cfg)


def keep(cfg: OpenAISettings, cache_path: Path | None) -> None:
    """Write what this process found for ``cfg``'s server into the run's cache (a run
    builds its backend after the identity): the next invocation reads it instead of asking."""
    if cache_path is None:
        return
    items = [
        (_memo_key(cfg, model), "dialect", asdict(found.dialect))
        for (path, url, model, setting), found in list(_FOUND.items())
        if path == str(cache_path) and url == _url(cfg) and setting == cfg.structured_output
        and found.final and not found.kept
    ]  # fmt: skip
    if not items:
        return
    from pipeline.run.cache import RequestCache

    try:
        with RequestCache(cache_path) as cache:
            cache.put_derived_many(items)
    except (CacheError, OSError):
        return  # only a record to save asking again: the next run asks
    for (path, url, _model, _setting), found in list(_FOUND.items()):
        if path == str(cache_path) and url == _url(cfg) and found.final:
            found.kept = True


def forget(cfg: OpenAISettings, model: str, cache_path: Path | None) -> None:
    """Drop what was found for ``model`` (the server refused it after all)."""
    _FOUND.pop((str(cache_path), _url(cfg), model, cfg.structured_output), None)
    if cache_path is not None and Path(cache_path).is_file():
        from pipeline.run.cache import RequestCache

        with contextlib.suppress(Exception), RequestCache(cache_path) as cache:
            cache.put_derived(_memo_key(cfg, model), "dialect", None)


def of_identity(identity: dict[str, Any] | None) -> dict[str, Dialect]:
    """The dialect of each model an identity records one for (:func:`identify`); a model
    it does not name is sent today's body."""
    records = (identity or {}).get("dialect")
    if not isinstance(records, dict):
        return {}
    found = {m: Dialect.from_record(r) for m, r in records.items()}
    return {m: d for m, d in found.items() if d is not None}


def sending(
    identity: dict[str, Any],
) -> tuple[Callable[[ChatRequest], list[ChatRequest]], list[str]]:
    """Each request as the server ``identity`` records is sent it (its model's recorded
    dialect, :meth:`Dialect.as_sent`; a model it does not name: today's body), and the
    plan's note on each dialect that changes what a prompt holds (``Backend.as_sent``)."""
    found = of_identity(identity)
    notes = [
        f"prompt tokens counted as {model}'s server is sent them "
        f"({d.describe()}; backend.openai.structured_output)"
        for model, d in found.items()
        if d.note_for_schema() or d.n == "split"
    ]

    def sent(req: ChatRequest) -> list[ChatRequest]:
        d = found.get(req.model)
        return d.as_sent(req) if d is not None else [req]

    return sent, notes


def identify(
    identity: dict[str, Any],
    cfg: OpenAISettings,
    models: Sequence[str],
    cache_path: Path | None,
) -> dict[str, Any]:
    """``identity`` with the dialect of every model whose body differs from today's, under
    ``dialect``: absent when the server takes today's body, so the identity, and every
    cache key, stays what it was."""
    standin = identity.get("kind") == "stand-in"
    found = {m: resolve(cfg, m, cache_path, standin=standin) for m in sorted(set(models))}
    records = {m: d.record() for m, d in found.items() if d.record()}
    if not records:
        return identity
    return {**identity, "dialect": records}
