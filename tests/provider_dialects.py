"""Loopback servers that take chat requests the way real providers do, each one way.

They answer like the stand-in (tests/standin_server.py: the pipeline's prompts played by a
rule-based player, bounded by ``max_tokens``), but refuse or ignore parts of the body as
the providers document or were seen to:

- ``strict``: every ``json_schema`` is held to OpenAI's strict-mode rules: a 400 unless
  every object lists all its properties as required with ``additionalProperties: false``,
  and a 400 for a keyword strict mode does not support (``maxLength``, ``minItems``...);
- ``llamacpp``: llama-cpp-python 0.3.36's server: a 500 "Input should be 'text' or
  'json_object'" for ``json_schema``; ``json_object`` with an optional ``schema`` beside it
  (its JSON Schema mode, which it enforces), ``n`` ignored (one choice);
- ``json_object``: ``json_object`` only: a 400 for ``json_schema`` and for any field
  besides ``type`` in ``response_format``;
- ``ignores_format``: ``response_format`` ignored: answers in free text, the JSON (when
  the prompt asks for it) wrapped in prose and a code fence;
- ``max_completion_tokens``: a 400 for ``max_tokens``, like OpenAI's reasoning models;
- ``no_n``: a 400 for ``n`` > 1;
- ``ignores_seed``: ``seed`` ignored; ``refuses_seed``: a 400 for it.

A "model" here reads the prompt as a model would: where the schema is only stated in the
prompt (json_object, no response_format) or its limits are (strict mode), the answer
keeps to what the prompt says. /v1/models reports ``owned_by: provider-<behaviour>``, so
the pipeline treats the server as a real one and asks it what it takes.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from aiohttp import web
from standin_server import StandinServer

BEHAVIOURS = (
    "strict",
    "llamacpp",
    "json_object",
    "ignores_format",
    "max_completion_tokens",
    "no_n",
    "ignores_seed",
    "refuses_seed",
)
# OpenAI's "Supported schemas" page: what strict mode does not take (the list for its
# fine-tuned models, the strictest), written out here as the provider documents it
STRICT_REFUSES = {
    "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "multipleOf",
    "exclusiveMinimum", "exclusiveMaximum", "patternProperties", "unevaluatedProperties",
    "propertyNames", "minProperties", "maxProperties", "unevaluatedItems", "contains",
    "minContains", "maxContains", "minItems", "maxItems", "uniqueItems", "allOf", "not",
    "if", "then", "else", "dependentRequired", "dependentSchemas",
}  # fmt: skip
_STATED = re.compile(r"JSON Schema[^\n]*:\n(\{.*)", re.S)
_LIMIT_LINE = re.compile(r"^- (answer[^:]*): (.+)$", re.M)
_LIMIT_WORDS = {
    r"at most (\d+) characters": "maxLength",
    r"at least (\d+) characters": "minLength",
    r"at most (\d+) items": "maxItems",
    r"at least (\d+) items": "minItems",
}


def _error(status: int, message: str, param: str | None = None, code: str | None = None,
           kind: str = "invalid_request_error") -> web.Response:  # fmt: skip
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


def strict_problem(schema: Any, where: tuple[str, ...] = ()) -> str | None:
    """Why OpenAI's strict mode refuses ``schema``, in its words; None when it takes it."""
    if not isinstance(schema, dict):
        return None
    for key in schema:
        if key in STRICT_REFUSES:
            return f"In context={where}, '{key}' is not permitted."
    if schema.get("type") == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            return (
                f"In context={where}, 'additionalProperties' is required to be supplied "
                "and to be false."
            )
        missing = [k for k in props if k not in (schema.get("required") or [])]
        if missing:
            return (
                f"In context={where}, 'required' is required to be supplied and to be an "
                f"array including every key in properties. Missing '{missing[0]}'."
            )
        for name, sub in props.items():
            if problem := strict_problem(sub, (*where, "properties", name)):
                return problem
    if "items" in schema:
        return strict_problem(schema["items"], (*where, "items"))
    return None


def stated_schema(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The JSON Schema a prompt states (the pipeline's json_object / none dialects)."""
    for m in messages:
        content = m.get("content")
        match = _STATED.search(content) if isinstance(content, str) else None
        if match:
            try:
                value, _ = json.JSONDecoder().raw_decode(match.group(1))
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def with_stated_limits(schema: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """``schema`` with the limits the prompt states beside it (strict mode's moved-out
    keywords) put back: what a model reading the prompt keeps to."""
    out = copy.deepcopy(schema)
    text = "\n".join(m.get("content") or "" for m in messages if isinstance(m.get("content"), str))
    for path, said in _LIMIT_LINE.findall(text):
        node: Any = out
        for part in re.findall(r"\.([^.\[]+)|(\[\])", path[len("answer") :]):
            name, items = part
            node = node.get("items", {}) if items else node.get("properties", {}).get(name, {})
        for pattern, key in _LIMIT_WORDS.items():
            if m := re.search(pattern, said):
                node[key] = int(m.group(1))
    return out


class ProviderServer(StandinServer):
    """The stand-in with one provider's way of taking requests (module docstring)."""

    def __init__(self, behaviour: str, **kw: Any) -> None:
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown behaviour {behaviour!r}; expected one of {BEHAVIOURS}")
        kw.setdefault("model", "provider-model")
        super().__init__(report_as={"owned_by": f"provider-{behaviour}"}, **kw)
        self.behaviour = behaviour
        self.refused: list[tuple[int, str]] = []  # (status, message) of every refusal

    def _refusal(self, body: dict[str, Any]) -> web.Response | None:
        b = self.behaviour
        fmt = body.get("response_format")
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        spec = (fmt or {}).get("json_schema") or {} if isinstance(fmt, dict) else {}
        if b == "strict" and kind == "json_schema":
            problem = strict_problem(spec.get("schema") or {})
            if problem:
                name = spec.get("name")
                return _error(400, f"Invalid schema for response_format '{name}': {problem}",
                              "response_format", "invalid_json_schema")  # fmt: skip
        if b == "llamacpp" and kind not in (None, "text", "json_object"):
            detail = {"type": "literal_error", "loc": ("body", "response_format", "type"),
                      "msg": "Input should be 'text' or 'json_object'", "input": kind}  # fmt: skip
            return _error(500, f"1 validation error:\n  {detail}", kind="internal_server_error")
        if b == "json_object" and kind is not None:
            if kind != "json_object":
                return _error(400, f"response_format type '{kind}' is not supported by this "
                              "model; use 'json_object'", "response_format")  # fmt: skip
            extra = sorted(k for k in fmt if k != "type")
            if extra:
                return _error(400, f"response_format: extra inputs are not permitted "
                              f"({extra[0]!r})", "response_format")  # fmt: skip
        if b == "max_completion_tokens" and "max_tokens" in body:
            return _error(400, "Unsupported parameter: 'max_tokens' is not supported with "
                          "this model. Use 'max_completion_tokens' instead.", "max_tokens",
                          "unsupported_parameter")  # fmt: skip
        if b == "no_n" and (body.get("n") or 1) > 1:
            return _error(400, "Unsupported value: 'n' must be 1 for this model.", "n",
                          "unsupported_value")  # fmt: skip
        if b == "refuses_seed" and "seed" in body:
            return _error(400, "Unrecognized request argument supplied: seed", None,
                          "unknown_parameter")  # fmt: skip
        return None

    def _as_read(self, body: dict[str, Any]) -> dict[str, Any]:
        """The body as this provider's model sees it: what the stand-in then answers."""
        b = self.behaviour
        body = dict(body)
        if "max_completion_tokens" in body:
            body["max_tokens"] = body.pop("max_completion_tokens")
        if b in ("ignores_seed", "llamacpp"):
            body.pop("seed", None)
        if b == "llamacpp":
            body["n"] = 1  # llama-cpp-python answers one choice, whatever n is
        fmt = body.get("response_format") if isinstance(body.get("response_format"), dict) else {}
        messages = body.get("messages") or []
        schema = None
        if fmt.get("type") == "json_schema" and b != "ignores_format":
            spec = fmt.get("json_schema") or {}
            schema = with_stated_limits(spec.get("schema") or {}, messages)
        elif fmt.get("type") == "json_object" and isinstance(fmt.get("schema"), dict):
            schema = fmt["schema"]  # llama-cpp-python's JSON Schema mode
        else:
            schema = stated_schema(messages)  # a model reading the prompt
        body.pop("response_format", None)
        if schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema},
            }
        return body

    async def _respond(self, body: dict[str, Any], fault: dict[str, Any] | None) -> web.Response:
        refusal = self._refusal(body)
        if refusal is not None:
            with self._lock:
                self.refused.append((refusal.status, json.loads(refusal.text)["error"]["message"]))
            return refusal
        response = await super()._respond(self._as_read(body), fault)
        if self.behaviour != "ignores_format" or response.status != 200:
            return response
        # free text around the JSON, as a chat model that was not held to a format writes
        reply = json.loads(response.text)
        for c in reply["choices"]:
            text = c["message"]["content"]
            if text.lstrip().startswith("{"):
                c["message"]["content"] = (
                    f"Sure! Here is my assessment.\n\n```json\n{text}\n```\n\nI hope this helps."
                )
        return web.json_response(reply)
