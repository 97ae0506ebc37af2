"""What a backend is asked and what it answers: chat requests, results and failures.

The lowest layer of the LLM path: the request cache, the runner and every backend import
these types from here, so none of them needs another's module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from pipeline.core.ids import canonical_json, content_hash

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
    # a reasoning model's reasoning tokens on top of max_tokens for this request; None: the
    # backend's setting (``backend.<name>.reasoning.budget``, in its identity). Set only by
    # the runner's retry of an answer whose reasoning used its whole budget; part of the key
    # only when set, so every other request's key is what it was
    reasoning_budget: int | None = None

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
            **(
                {} if self.reasoning_budget is None else {"reasoning_budget": self.reasoning_budget}
            ),
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
            or not (self.reasoning_budget is None or type(self.reasoning_budget) is int)
        ):
            return canonical_json(self.to_dict())
        enc = _encode_str
        messages = ",".join(
            '{"content":' + enc(c) + ',"role":' + enc(r) + "}" for r, c in self.messages
        )
        schema = "null" if self.json_schema is None else _schema_json(self.json_schema)
        name = enc(self.schema_name) if self.json_schema else "null"
        budget = (
            "" if self.reasoning_budget is None else f'"reasoning_budget":{self.reasoning_budget},'
        )
        return (
            f'{{"json_schema":{schema},"max_tokens":{self.max_tokens},"messages":[{messages}],'
            f'"model":{enc(self.model)},"n":{self.n},{budget}"schema_name":{name},'
            f'"seed":{"null" if self.seed is None else self.seed},'
            f'"served_by":{enc(self.served_by)},'
            f'"temperature":{json.dumps(self.temperature)},"top_p":{json.dumps(self.top_p)}}}'
        )


@dataclass
class Choice:
    """One answer. ``text`` is the answer alone: a reasoning model's reasoning is never in
    it (pipeline/backends/reasoning.py) but in ``reasoning`` (None: the backend does not
    handle reasoning, or the model wrote none), with its tokens; ``reasoning_cut``: the
    reasoning did not end before the token limit, so there is no answer at all."""

    text: str
    finish_reason: str
    reasoning: str | None = None
    reasoning_tokens: int = 0
    reasoning_cut: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text, "finish_reason": self.finish_reason}
        if self.reasoning is not None:  # absent otherwise: older caches read back the same
            out["reasoning"] = self.reasoning
            out["reasoning_tokens"] = self.reasoning_tokens
            out["reasoning_cut"] = self.reasoning_cut
        return out

    @classmethod
    def from_dict(cls, c: dict[str, Any]) -> Choice:
        return cls(
            c["text"],
            c["finish_reason"],
            c.get("reasoning"),
            int(c.get("reasoning_tokens") or 0),
            bool(c.get("reasoning_cut", False)),
        )


@dataclass
class ChatResult:
    choices: list[Choice]
    prompt_tokens: int = 0
    # every output token, a reasoning model's reasoning included (what the engine generated
    # and a provider bills); the reasoning's share is ``reasoning_tokens``
    completion_tokens: int = 0
    model: str = ""

    @property
    def reasoning_tokens(self) -> int:
        return sum(c.reasoning_tokens for c in self.choices)

    @property
    def reasoned(self) -> bool:
        """Whether the backend took a reasoning block out of any of its answers."""
        return any(c.reasoning is not None for c in self.choices)

    def to_dict(self) -> dict[str, Any]:
        return {
            "choices": [c.to_dict() for c in self.choices],
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "model": self.model,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChatResult:
        return cls(
            choices=[Choice.from_dict(c) for c in d["choices"]],
            prompt_tokens=d.get("prompt_tokens", 0),
            completion_tokens=d.get("completion_tokens", 0),
            model=d.get("model", ""),
        )


def reasoning_allowance(req: ChatRequest, reasoning: dict[str, Any] | None) -> int:
    """The reasoning tokens the engine is asked for on top of ``req.max_tokens``, from the
    answering backend's identity record of its reasoning settings (``identity["reasoning"]``,
    ``ReasoningSettings.record``): none when it does not reason, and none for a JSON request
    answered under the grammar from its first token (``json_mode: grammar_only``)."""
    if not reasoning:
        return 0
    if req.json_schema is not None and reasoning.get("json_mode") == "grammar_only":
        return 0
    if req.reasoning_budget is not None:
        return req.reasoning_budget
    return int(reasoning.get("budget") or 0)


def output_bound(req: ChatRequest, reasoning: dict[str, Any] | None = None) -> int:
    """The most output tokens one choice of ``req`` can take: its max_tokens plus the
    reasoning's allowance (the budget, `prb plan` and the ledger count it so)."""
    return req.max_tokens + reasoning_allowance(req, reasoning)


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
