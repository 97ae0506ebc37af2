"""The one interface every chat backend implements."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.ids import content_hash


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
            k = content_hash(self.to_dict())
            object.__setattr__(self, "_key", k)
        return k


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


class Backend(abc.ABC):
    """Answers chat requests; results stream back as they arrive, tagged by input index."""

    name: str = "base"

    @abc.abstractmethod
    def run(
        self, requests: Sequence[ChatRequest]
    ) -> AsyncIterator[tuple[int, ChatResult | RequestFailure]]:
        """Yield ``(index, result or failure)`` for every request, in completion order."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections or engines."""
