"""What a structured-output dialect is: how an OpenAI-compatible server is asked for a JSON
answer (``backend.openai.structured_output``). The dialects themselves are classes in
``pipeline/backends/openai/dialects.py``; adding one is a class there (or anywhere) and a
``DIALECTS.register`` line.

A dialect class owns its request body (:meth:`StructuredOutput.apply`), what the prompt
says instead of what the body leaves out (:meth:`StructuredOutput.note`), how its answers
are read (``enforced``: the server is held to the schema, else the JSON object is taken
out of the text around it) and its place in ``auto``'s probe (``probe_rank``: lower is
asked first; the dialect with the highest rank is the prompt-only fallback a server that
ignores the schema is moved to). The probe order is these classes' ranks, not a list.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pipeline.core.registry import Registry
from pipeline.types.chat import ChatRequest

SETTING = "backend.openai.structured_output"


class StructuredOutput:
    """One structured-output dialect (classmethods only: a dialect holds no state)."""

    name: ClassVar[str] = ""
    # the place in auto's probe: lower is asked first
    probe_rank: ClassVar[int] = 0
    # the server is held to the schema: an answer is read as it comes
    enforced: ClassVar[bool] = False
    # the request carries the schema: free text back means the server ignored it
    sends_schema: ClassVar[bool] = False
    # one line for `prb config fields` and the docs
    summary: ClassVar[str] = ""

    @classmethod
    def apply(cls, req: ChatRequest, body: dict[str, Any], schema_name: str) -> None:
        """Put this dialect's ``response_format`` (or none) into ``body``, which holds the
        request's own (``json_schema``) to begin with."""
        raise NotImplementedError

    @classmethod
    def note(cls, req: ChatRequest) -> str:
        """What the system message says of a request with a schema; empty: nothing."""
        raise NotImplementedError


DIALECTS: Registry[type[StructuredOutput]] = Registry(
    "structured-output dialect", StructuredOutput, field=SETTING
)
_HERE = "pipeline.backends.openai.dialects"
DIALECTS.register("json_schema", f"{_HERE}:JsonSchema")
DIALECTS.register("json_schema_strict", f"{_HERE}:JsonSchemaStrict")
DIALECTS.register("json_object_schema", f"{_HERE}:JsonObjectSchema")
DIALECTS.register("json_object", f"{_HERE}:JsonObject")
DIALECTS.register("none", f"{_HERE}:PromptOnly")


def probe_order() -> list[str]:
    """The dialects in the order ``auto`` tries them: by ``probe_rank``, then name."""
    return sorted(DIALECTS.names(), key=lambda n: (DIALECTS.get(n).probe_rank, n))


def next_in_probe(name: str) -> str | None:
    """The dialect ``auto`` tries after ``name`` (None after the last)."""
    order = probe_order()
    i = order.index(name) if name in order else len(order)
    return order[i + 1] if i + 1 < len(order) else None


def prompt_only() -> str:
    """The last resort: the dialect with the highest rank (the schema in the prompt only)."""
    return probe_order()[-1]
