"""What a backend is asked and what it answers: chat requests, results and failures.

The lowest layer of the LLM path: the request cache, the runner and every backend import
these types from here, so none of them needs another's module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from pipeline.ids import canonical_json, content_hash

# json's own string encoder for ensure_ascii=False (what canonical_json uses)
_encode_str = json.encoder.encode_basestring
# id(schema) -> (schema, its canonical JSON); holding the object keeps its id unique
_SCHEMA_JSON: dict[int, tuple[dict, str]] = {}


def _schema_json(schema: dict) -> str:
    hit = _SCHEMA_JSON.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    text = canonical_json(schema)
    if len(_SCHEMA_JSON) >= 4096:  # per-example schemas come and go: a bounded memo
        _SCHEMA_JSON.clear()
    _SCHEMA_JSON[id(schema)] = (schema, text)
    return text


class Sampling(Protocol):
    """What a config's sampling section holds (``SamplingSection``)."""

    temperature: float
    top_p: float
    max_tokens: int | None  # None: the stage passes its schema's bound


@dataclass(frozen=True)
class ChatRequest:
    """A chat completion request. ``key`` hashes everything that decides the answer."""

    messages: tuple[tuple[str, str], ...]  # (role, content) pairs; hashable and ordered
    model: str
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    n: int = 1
    seed: int | None = None
    json_schema: dict | None = field(default=None, hash=False)
    schema_name: str = "answer"
    # the id of the backend that answers (pipeline/backends/identity.py): part of the key,
    # so one backend's answer is never served as another's; never sent to a server
    served_by: str = ""

    @classmethod
    def sampled(
        cls,
        messages: tuple[tuple[str, str], ...],
        model: str,
        sampling: Sampling,
        *,
        n: int = 1,
        seed: int | None = None,
        max_tokens: int | None = None,
        json_schema: dict | None = None,
        schema_name: str = "answer",
        served_by: str = "",
    ) -> ChatRequest:
        """A request with a config's sampling settings (every stage builds its requests
        here); ``max_tokens`` overrides the section's when a schema needs more."""
        return cls(
            messages=messages,
            model=model,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=_tokens(max_tokens or sampling.max_tokens),
            n=n,
            seed=seed,
            json_schema=json_schema,
            schema_name=schema_name,
            served_by=served_by,
        )

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": self.message_dicts(),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "n": self.n,
            "seed": self.seed,
            "json_schema": self.json_schema,
            "schema_name": self.schema_name if self.json_schema else None,
            "served_by": self.served_by,
        }

    def openai_body(self) -> dict[str, Any]:
        """The OpenAI chat-completions request body (the openai and ray backends send it)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self.message_dicts(),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "n": self.n,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        if self.json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": self.schema_name, "schema": self.json_schema},
            }
        return body

    @property
    def key(self) -> str:
        # Cached on the instance: hashing the prompt is the main per-request CPU cost.
        k = self.__dict__.get("_key")
        if k is None:
            k = content_hash(self.canonical())
            object.__setattr__(self, "_key", k)
        return k

    def canonical(self) -> str:
        """``canonical_json(self.to_dict())``, built from parts: the schema's JSON (the
        same object serves thousands of requests) is serialised once. The result is the
        same string to the byte, so cache keys never change (a test holds them equal)."""
        if not all(isinstance(x, (int, float)) for x in (self.temperature, self.top_p)) or (
            not isinstance(self.max_tokens, int)
            or not isinstance(self.n, int)
            or not (self.seed is None or isinstance(self.seed, int))
            or not isinstance(self.served_by, str)
        ):
            return canonical_json(self.to_dict())
        enc = _encode_str
        messages = ",".join(
            '{"content":' + enc(c) + ',"role":' + enc(r) + "}" for r, c in self.messages
        )
        schema = "null" if self.json_schema is None else _schema_json(self.json_schema)
        name = enc(self.schema_name) if self.json_schema else "null"
        return (
            f'{{"json_schema":{schema},"max_tokens":{self.max_tokens},"messages":[{messages}],'
            f'"model":{enc(self.model)},"n":{self.n},"schema_name":{name},'
            f'"seed":{"null" if self.seed is None else self.seed},'
            f'"served_by":{enc(self.served_by)},'
            f'"temperature":{json.dumps(self.temperature)},"top_p":{json.dumps(self.top_p)}}}'
        )


@dataclass
class Choice:
    text: str
    finish_reason: str


@dataclass
class ChatResult:
    choices: list[Choice]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "choices": [{"text": c.text, "finish_reason": c.finish_reason} for c in self.choices],
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "model": self.model,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChatResult:
        return cls(
            choices=[Choice(c["text"], c["finish_reason"]) for c in d["choices"]],
            prompt_tokens=d.get("prompt_tokens", 0),
            completion_tokens=d.get("completion_tokens", 0),
            model=d.get("model", ""),
        )


@dataclass
class RequestFailure:
    """A request that failed for good in this run: recorded, never stored as data."""

    reason: str
    attempts: int = 1
    transient: bool = True  # False for client errors that re-sending cannot fix
    # True: nothing was sent; the backend holds no answer for it yet and it waits for one
    # from elsewhere (batch files, pipeline/batch/): the runner keeps its example pending
    unanswered: bool = False


def _tokens(max_tokens: int | None) -> int:
    if max_tokens is None:  # the stage gives the bound its schema needs (schemas.request_tokens)
        raise ValueError("a request needs max_tokens: the stage gives its schema's bound")
    return max_tokens
