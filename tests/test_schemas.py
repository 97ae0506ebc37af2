"""Every JSON schema the stages send: valid JSON Schema, closed, ids pinned, free text sent
without its bound (``schemas.wire``) and checked with it, and the full schema small enough
that its longest answer fits the request's max_tokens. The validator the runner applies
agrees with the jsonschema package."""

from __future__ import annotations

import json
import os
import random
from typing import Any

import jsonschema
import pytest
from conftest import write_config

from pipeline.config import load_config
from pipeline.core.errors import ConfigError
from pipeline.core.ids import stable_id
from pipeline.orchestration.orchestrate import run_pipeline
from pipeline.types import schemas


def _walk(schema: dict[str, Any], path: str = "$"):
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")


def assert_closed_and_bounded(schema: dict[str, Any], max_tokens: int) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    for path, node in _walk(schema):
        kind = node.get("type")
        if kind == "object":
            assert node.get("additionalProperties") is False, path
            assert set(node["required"]) == set(node["properties"]), path
        elif kind == "array":
            assert "maxItems" in node, path
        elif kind == "string" and "enum" not in node:
            assert "maxLength" in node, path
        elif kind == "integer":
            assert "enum" in node or ("minimum" in node and "maximum" in node), path
    # the longest valid answer fits the request's max_tokens, at the measured tokens per
    # character (benchmarks/verdict_tokens.py)
    assert schemas.answer_tokens(schema) <= max_tokens


def assert_sent_form(schema: dict[str, Any]) -> None:
    """What an engine is sent: closed and pinned like the full schema, no string bound."""
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schemas.bounded_strings(schema) == 0
    for path, node in _walk(schema):
        if node.get("type") == "object":
            assert node.get("additionalProperties") is False, path
            assert set(node["required"]) == set(node["properties"]), path
        elif node.get("type") == "array":
            assert "maxItems" in node, path


def test_every_schema_the_stages_send_is_closed_unbounded_and_fits(tmp_path, server):
    cfg = write_config(tmp_path, server, rubrics={"source": "generated"})
    config = load_config(cfg)
    run_pipeline(config, until="judge", progress=False)
    sent = [r["body"] for r in server.requests if r["body"].get("response_format")]
    names = {b["response_format"]["json_schema"]["name"] for b in sent}
    assert names == {"rubric", "QualityVerdict", "CoverageVerdict", "PairwiseVerdict"}
    j, r = config.judge, config.rubrics
    full = {
        "rubric": [schemas.rubric_schema(r.min_items, r.max_items, r.sampling.max_tokens)],
        "QualityVerdict": [schemas.quality_schema(j.sampling.max_tokens, j.rationale_max_chars)],
        "PairwiseVerdict": [schemas.pairwise_schema(j.sampling.max_tokens, j.rationale_max_chars)],
        "CoverageVerdict": [
            schemas.coverage_schema(n, j.sampling.max_tokens, j.rationale_max_chars)[0]
            for n in range(1, 11)
        ],
    }
    for body in sent:
        fmt = body["response_format"]["json_schema"]
        assert_sent_form(fmt["schema"])
        # the sent schema is the wire form of a full, bounded schema that fits max_tokens
        origin = [s for s in full[fmt["name"]] if schemas.wire(s) == fmt["schema"]]
        assert len(origin) == 1, fmt["name"]
        assert_closed_and_bounded(origin[0], body["max_tokens"])
        if fmt["name"] == "CoverageVerdict":
            # one property per rubric point, the labels the prompt lists, in its order
            text = body["messages"][-1]["content"]
            listed = [line[2:].split(":")[0] for line in text.splitlines()
                      if line.startswith("- P")]  # fmt: skip
            assert listed == schemas.coverage_keys(len(listed))
            assert list(fmt["schema"]["properties"]["scores"]["properties"]) == listed
            assert fmt["schema"]["properties"]["scores"]["properties"][listed[0]] == {
                "type": "integer",
                "enum": [0, 1, 2],
            }
        if fmt["name"] == "PairwiseVerdict":
            assert next(iter(fmt["schema"]["properties"])) == "winner"  # the decision first


@pytest.mark.parametrize("max_tokens", [384, 768, 1024, 4096])
def test_schema_bounds_scale_with_max_tokens(max_tokens):
    q = schemas.quality_schema(max_tokens)
    assert_closed_and_bounded(q, max_tokens)
    assert_closed_and_bounded(schemas.pairwise_schema(max_tokens), max_tokens)
    assert_closed_and_bounded(schemas.rubric_schema(2, 6, 4 * max_tokens), 4 * max_tokens)


def test_rationales_grow_with_max_tokens_up_to_the_cap():
    lengths = [
        schemas.quality_schema(m)["properties"]["correctness_rationale"]["maxLength"]
        for m in (384, 512, 768, 1024, 2048, 8192)
    ]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1] == 300


def test_too_few_tokens_for_a_schema_is_refused():
    with pytest.raises(schemas.SchemaBudgetError, match="raise max_tokens"):
        schemas.quality_schema(256)


def test_a_large_rubric_raises_the_coverage_request_tokens():
    schema, tokens = schemas.coverage_schema(40, 1024)
    assert tokens > 1024
    assert_closed_and_bounded(schema, tokens)
    rationale = schema["properties"]["rationales"]["properties"]["P1"]
    assert rationale["maxLength"] == schemas.MIN_RATIONALE


def test_config_load_fails_when_a_schema_cannot_fit(tmp_path):
    cfg = write_config(tmp_path, judge={"sampling": {"max_tokens": 100}})
    with pytest.raises(ConfigError, match=r"judge\.sampling\.max_tokens") as err:
        load_config(cfg)
    assert "raise max_tokens" in str(err.value)
    cfg = write_config(
        tmp_path, rubrics={"source": "generated", "max_items": 10, "sampling": {"max_tokens": 400}}
    )
    with pytest.raises(ConfigError, match=r"rubrics\.sampling\.max_tokens"):
        load_config(cfg)


def _mutations(value: Any, rng: random.Random) -> list[Any]:
    """Valid and invalid variants of an instance: wrong types, extra and missing keys,
    out-of-range numbers, long strings, duplicates."""
    out = [value]
    if isinstance(value, dict):
        for k in list(value):
            out.append({kk: v for kk, v in value.items() if kk != k})
            for sub in _mutations(value[k], rng)[1:3]:
                out.append({**value, k: sub})
        out.append({**value, "extra": 1})
        out.append([value])
    elif isinstance(value, list):
        out += [value[:1], value * 2, [*value, value[0]] if value else [1], "x"]
    elif isinstance(value, str):
        out += ["x" * 400, 3, None, ""]
    elif isinstance(value, bool):
        out += [1, "true"]
    elif isinstance(value, int):
        out += [value + 10, -1, 2.5, True, str(value)]
    return out


def test_the_runner_validator_agrees_with_jsonschema():
    rng = random.Random(0)
    cases = [
        (schemas.quality_schema(1024), {"correctness": 4, "relevance": 5, "helpfulness": 3,
          "correctness_rationale": "a", "relevance_rationale": "b",
          "helpfulness_rationale": "c"}),
        (schemas.pairwise_schema(1024), {"winner": "tie", "rationale": "close"}),
        (schemas.coverage_schema(2, 1024)[0],
         {"scores": {"P1": 0, "P2": 2}, "rationales": {"P1": "no", "P2": "yes"}}),
        (schemas.rubric_schema(2, 4, 2048),
         {"aspects": [{"aspect": "Names a cheap tool", "evidence": "e", "reason": "r"},
                      {"aspect": "Keeps it short", "evidence": "e", "reason": "r"}]}),
    ]  # fmt: skip
    checked = 0
    for schema, valid in cases:
        ref = jsonschema.Draft202012Validator(schema)
        for inst in _mutations(valid, rng):
            for nested in [inst, *_mutations(inst, rng)]:
                ours = True
                try:
                    schemas.parse(schema, json.dumps(nested))
                except ValueError:
                    ours = False
                assert ours == ref.is_valid(nested), (schema.get("properties", {}).keys(), nested)
                checked += 1
    assert checked > 200


def test_a_repetitive_rubric_is_reasked_with_the_reason(tmp_path):
    """A model that repeats one aspect: merging leaves one, the stage re-asks saying so,
    and the distinct answer to the re-ask becomes the rubric; the stats count it."""
    from standin_server import StandinServer

    asked: list[str] = []

    def repetitive(body: dict, i: int) -> str | None:
        name = ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
        if name != "rubric":
            return None
        last = body["messages"][-1]["content"]
        asked.append(last)
        if "merging aspects" in last:  # the re-ask: distinct aspects this time
            aspects = ["Names a cheap first step", "Keeps sessions under twenty minutes"]
        else:
            aspects = ["Gives practical tips", "Gives practical tips.", "gives practical TIPS"]
        return json.dumps(
            {"aspects": [{"aspect": a, "evidence": "e", "reason": "r"} for a in aspects]}
        )

    with StandinServer(responder=repetitive) as srv:
        cfg = write_config(tmp_path, srv, rubrics={"source": "generated", "min_items": 2})
        stats = run_pipeline(load_config(cfg), until="rubrics", progress=False)["rubrics"]
    assert stats["rubrics"] == 12 and stats["rejected"] == 0
    assert stats["reasked_too_few"] == 12
    reasks = [a for a in asked if "merging aspects" in a]
    assert len(reasks) == 12
    assert "only 1 distinct aspects remain" in reasks[0]
    assert "'Gives practical tips.' repeats 'Gives practical tips'" in reasks[0]


def test_a_model_that_stays_repetitive_is_rejected_after_the_reasks(tmp_path):
    from standin_server import StandinServer

    def stuck(body: dict, i: int) -> str | None:
        name = ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
        if name != "rubric":
            return None
        aspects = ["Gives practical tips", "gives practical tips!"]
        return json.dumps(
            {"aspects": [{"aspect": a, "evidence": "e", "reason": "r"} for a in aspects]}
        )

    with StandinServer(responder=stuck) as srv:
        cfg = write_config(
            tmp_path, srv, rubrics={"source": "generated", "min_items": 2, "reasks": 1}
        )
        stats = run_pipeline(load_config(cfg), until="rubrics", progress=False)["rubrics"]
        assert srv.request_count == 24  # each example: the request and one re-ask
    assert stats["rubrics"] == 0 and stats["reject_reasons"] == {"too_few_items": 12}


# ---- what the grammar engines enforce ---------------------------------------------------
#
# A constrained decoder only guarantees what its converter turns into grammar rules; a
# keyword it drops is not enforced, so an answer that breaks it reaches our validator and
# fails the request. Every keyword a stage's schema uses must be enforced by llama.cpp's
# converter (llama_cpp/llama_grammar.py, SchemaConverter.visit) and by xgrammar's (vLLM's
# default structured-output backend), or be listed in UNENFORCED_OK with the reason.
#
# From the converters' source: llama.cpp 0.3.36 turns type, properties, required,
# additionalProperties, enum/const, items with minItems/maxItems, and minLength/maxLength
# into rules; it ignores minimum/maximum/exclusive*/multipleOf ("TODO: support minimum,
# maximum" in visit()) and uniqueItems, and lets raw control characters into strings
# (its `char` rule is [^"\\]), which schemas.parse accepts. xgrammar 0.2.8 enforces the
# same and numeric bounds; vLLM 0.26.0 sends a schema with uniqueItems, contains,
# min/maxContains, multipleOf, patternProperties or propertyNames to llguidance instead
# (vllm/v1/structured_output/backend_xgrammar.py: has_xgrammar_unsupported_json_features).
# The tables are held to the engines' behaviour below: for every keyword a schema uses,
# an answer that breaks only that keyword must be refused by the engine's grammar.
ENFORCED = {
    "llama.cpp": {"type", "properties", "required", "additionalProperties", "enum",
                  "items", "minItems", "maxItems", "minLength", "maxLength"},
    "xgrammar": {"type", "properties", "required", "additionalProperties", "enum", "items",
                 "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum"},
}  # fmt: skip
# Keywords that constrain nothing (documentation only).
ANNOTATIONS = {"title", "description"}
# engine -> {keyword: why it is acceptable that the engine does not enforce it}. Empty:
# the scores are enums (not minimum/maximum) and rubrics carry no uniqueItems.
UNENFORCED_OK: dict[str, dict[str, str]] = {"llama.cpp": {}, "xgrammar": {}}

ITEM_IDS = ["a" + stable_id("ex", i, length=10) for i in range(3)]


def stage_schemas() -> list[tuple[str, dict[str, Any]]]:
    """Every schema the stages send, built the way they build them, for a few settings."""
    out = []
    for m, cap in ((384, 300), (1024, 300), (4096, 120)):
        out.append((f"quality/{m}", schemas.quality_schema(m, cap)))
        out.append((f"pairwise/{m}", schemas.pairwise_schema(m, cap)))
        out.append((f"coverage/{m}", schemas.coverage_schema(len(ITEM_IDS), m, cap)[0]))
    out.append(("coverage/1item", schemas.coverage_schema(1, 1024)[0]))
    out.append(("rubric/2-6", schemas.rubric_schema(2, 6, 2048)))
    out.append(("rubric/1-10", schemas.rubric_schema(1, 10, 8192)))
    return out


def keywords(schema: dict[str, Any]) -> set[str]:
    """The JSON Schema keywords used anywhere in ``schema`` (not property names)."""
    return {k for _, node in _walk(schema) for k in node}


def shortest_valid(schema: dict[str, Any]) -> Any:
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema["type"]
    if kind == "object":
        return {k: shortest_valid(v) for k, v in schema["properties"].items()}
    if kind == "array":
        return [shortest_valid(schema["items"]) for _ in range(max(schema.get("minItems", 0), 1))]
    if kind == "string":
        return "x" * max(schema.get("minLength", 0), 1)
    if kind == "integer":
        return schema.get("minimum", 0)
    raise AssertionError(f"no example for {schema}")


def _replace(value: Any, path: list[Any], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    return [_replace(v, rest, new) if i == head else v for i, v in enumerate(value)]


def _drop(value: dict, name: str) -> dict:
    return {k: v for k, v in value.items() if k != name}


def violations(schema: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(keyword, where, instance) for answers that break exactly one keyword of one node."""
    base = shortest_valid(schema)
    out: list[tuple[str, str, Any]] = []

    def visit(node: dict[str, Any], path: list[Any]) -> None:
        where = "$" + "".join(f"[{p!r}]" for p in path)

        def bad(keyword: str, new: Any) -> None:
            out.append((keyword, where, _replace(base, path, new)))

        if "enum" in node:
            ints = [v for v in node["enum"] if isinstance(v, int)]
            bad("enum", max(ints) + 1 if ints else "zz-not-listed")
            if ints:
                bad("enum", min(ints) - 1)
            bad("type", "1" if node.get("type") == "integer" else 7)
            return
        kind = node["type"]
        if kind == "object":
            current = shortest_valid(node)
            bad("type", "{}")
            bad("additionalProperties", {**current, "zz_extra": 1})
            for name, sub in node["properties"].items():
                if name in node.get("required", []):
                    bad("required", _drop(current, name))
                visit(sub, [*path, name])
        elif kind == "array":
            item = shortest_valid(node["items"])
            bad("type", "[]")
            if node.get("minItems", 0) > 0:
                bad("minItems", [item] * (node["minItems"] - 1))
            if "maxItems" in node:
                bad("maxItems", [item] * (node["maxItems"] + 1))
            bad("items", [7] * max(node.get("minItems", 0), 1))
            visit(node["items"], [*path, 0])
        elif kind == "string":
            bad("type", 7)
            if "maxLength" in node:
                bad("maxLength", "y" * (node["maxLength"] + 1))
            if node.get("minLength", 0) > 0:
                bad("minLength", "y" * (node["minLength"] - 1))
        elif kind == "integer":
            bad("type", "1")
            if "minimum" in node:
                bad("minimum", node["minimum"] - 1)
            if "maximum" in node:
                bad("maximum", node["maximum"] + 1)

    visit(schema, [])
    return out


def _have(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _needs(module: str, extra: str):
    skip = pytest.mark.skipif(
        not _have(module) and not os.environ.get("CI"),
        reason=f"{module} is not installed (pip install 'personalized-rewardbench[{extra}]'); "
        "CI runs this",
    )
    if module != "llama_cpp":
        return skip
    return lambda f: pytest.mark.llamacpp(skip(f))


class LlamaCppGrammar:
    """llama.cpp's own grammar sampler over the default model's vocabulary: does the
    grammar built from a schema let a text through, token by token, and then stop?"""

    def __init__(self) -> None:
        import llama_cpp

        from pipeline.backends.llamacpp_backend import DEFAULT_MODEL, resolve_model

        self.lc = llama_cpp
        self.llm = llama_cpp.Llama(
            model_path=str(resolve_model(DEFAULT_MODEL)), vocab_only=True, verbose=False
        )

    def build(self, schema: dict[str, Any]) -> str:
        from llama_cpp.llama_grammar import LlamaGrammar

        gbnf = LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)._grammar
        sampler = self._sampler(gbnf)
        assert sampler, "llama.cpp's grammar parser refused the converted schema"
        self.lc.llama_sampler_free(sampler)
        return gbnf

    def _sampler(self, gbnf: str) -> Any:
        return self.lc.llama_sampler_init_grammar(self.llm._model.vocab, gbnf.encode(), b"root")

    def accepts(self, gbnf: str, text: str) -> bool:
        import ctypes
        import math

        lc, eos = self.lc, self.llm.token_eos()
        sampler = self._sampler(gbnf)
        try:
            tokens = self.llm.tokenize(text.encode(), add_bos=False, special=False)
            for tok in [*tokens, eos]:
                data = (lc.llama_token_data * 1)(lc.llama_token_data(tok, 0.0, 0.0))
                cur = lc.llama_token_data_array(data, 1, -1, False)
                lc.llama_sampler_apply(sampler, ctypes.byref(cur))
                if math.isinf(data[0].logit):  # the grammar masked this token
                    return False
                if tok != eos:
                    lc.llama_sampler_accept(sampler, tok)
            return True
        finally:
            self.lc.llama_sampler_free(sampler)


@pytest.fixture(scope="module")
def llamacpp_grammar() -> LlamaCppGrammar:
    return LlamaCppGrammar()


def test_every_stage_schema_uses_only_keywords_each_engine_enforces():
    """Fails when a stage's schema gains a keyword an engine would silently ignore."""
    for name, schema in stage_schemas():
        used = keywords(schema) - ANNOTATIONS
        for engine, enforced in ENFORCED.items():
            unenforced = used - enforced - set(UNENFORCED_OK[engine])
            assert not unenforced, f"{name}: {engine} does not enforce {sorted(unenforced)}"
    # vLLM 0.26.0 hands a schema with these to llguidance instead of xgrammar
    routed_away = {"uniqueItems", "contains", "minContains", "maxContains", "multipleOf",
                   "patternProperties", "propertyNames"}  # fmt: skip
    assert not any(keywords(s) & routed_away for _, s in stage_schemas())


def test_the_violation_probes_break_what_our_validator_checks():
    # each probe must be a real violation, or the engine checks below prove nothing
    for name, schema in stage_schemas():
        probes = violations(schema)
        covered = {k for k, _, _ in probes}
        assert keywords(schema) - ANNOTATIONS - {"properties"} <= covered, name
        schemas.parse(schema, json.dumps(shortest_valid(schema)))
        for keyword, where, inst in probes:
            with pytest.raises(ValueError):
                schemas.parse(schema, json.dumps(inst))
                pytest.fail(f"{name}: breaking {keyword} at {where} passed: {inst}")


@_needs("llama_cpp", "local")
def test_llamacpp_grammar_builds_and_refuses_every_violation(llamacpp_grammar):
    g = llamacpp_grammar
    for name, schema in stage_schemas():
        gbnf = g.build(schema)
        valid = shortest_valid(schema)
        assert g.accepts(gbnf, json.dumps(valid)), name
        assert g.accepts(gbnf, json.dumps(valid, separators=(",", ":"))), name
        for keyword, where, inst in violations(schema):
            if keyword in UNENFORCED_OK["llama.cpp"]:
                continue
            assert not g.accepts(gbnf, json.dumps(inst)), f"{name}: {keyword} at {where}"


@_needs("llama_cpp", "local")
def test_llamacpp_lets_raw_control_characters_through_and_parse_takes_them(llamacpp_grammar):
    """Why schemas.parse is lenient: llama.cpp's string rule admits a raw newline or tab,
    which strict JSON parsing rejects ("Invalid control character")."""
    g = llamacpp_grammar
    schema = schemas.pairwise_schema(1024)
    text = '{"winner": "A", "rationale": "first line\nsecond\tline"}'
    assert g.accepts(g.build(schema), text)
    with pytest.raises(ValueError, match="Invalid control character"):
        json.loads(text)
    assert schemas.parse(schema, text)["rationale"] == "first line\nsecond\tline"


@_needs("llama_cpp", "local")
def test_llamacpp_ignores_numeric_bounds(llamacpp_grammar):
    """Why scores are an enum: llama.cpp's converter drops minimum/maximum."""
    g = llamacpp_grammar
    bounded = {"type": "object", "properties": {"s": {"type": "integer", "minimum": 1,
               "maximum": 5}}, "required": ["s"], "additionalProperties": False}  # fmt: skip
    assert g.accepts(g.build(bounded), '{"s": 9}')
    as_enum = {**bounded, "properties": {"s": {"type": "integer", "enum": [1, 2, 3, 4, 5]}}}
    assert not g.accepts(g.build(as_enum), '{"s": 9}')
    assert g.accepts(g.build(as_enum), '{"s": 5}')


@_needs("xgrammar", "dev")
def test_xgrammar_builds_and_refuses_every_violation():
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string as accepts

    for name, schema in stage_schemas():
        # as vLLM 0.26.0 compiles it: compile_json_schema(schema, any_whitespace=True)
        grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=True)
        valid = shortest_valid(schema)
        assert accepts(grammar, json.dumps(valid)), name
        assert accepts(grammar, json.dumps(valid, separators=(",", ":"))), name
        for keyword, where, inst in violations(schema):
            if keyword in UNENFORCED_OK["xgrammar"]:
                continue
            assert not accepts(grammar, json.dumps(inst)), f"{name}: {keyword} at {where}"


# ---- what an engine is sent, and how answers are read (schemas.wire, schemas.read) ------


def test_the_wire_form_drops_only_the_free_texts_bounds():
    for name, schema in stage_schemas():
        sent = schemas.wire(schema)
        assert schemas.bounded_strings(sent) == 0, name
        assert schemas.bounded_strings(schema) > 0, name
        assert sent is schemas.wire(schema)  # one object per schema: one compiled grammar
        # the same closed structure: put the bounds back and it is the full schema again
        bounds = {path: node["maxLength"] for path, node in _walk(schema) if "maxLength" in node}
        back = json.loads(json.dumps(sent))
        for path, node in _walk(back):
            if path in bounds:
                node["maxLength"] = bounds[path]
        assert json.dumps(back, sort_keys=True) == json.dumps(schema, sort_keys=True), name


def test_the_backend_identity_decides_the_form_a_request_carries():
    q = schemas.quality_schema(1024)
    assert schemas.for_engine(q, {"kind": "openai"}) is schemas.wire(q)
    assert schemas.for_engine(q, {"kind": "llamacpp", schemas.SCHEMA_BOUNDS: True}) is q


def test_coverage_is_one_schema_per_rubric_size():
    a, _ = schemas.coverage_schema(3, 1024)
    assert a is schemas.coverage_schema(3, 1024)[0]
    assert list(a["properties"]["scores"]["properties"]) == ["P1", "P2", "P3"]
    assert schemas.coverage_keys(3) == ["P1", "P2", "P3"]


def test_free_text_over_its_bound_is_clipped_and_recorded():
    q = schemas.quality_schema(1024)
    bound = q["properties"]["relevance_rationale"]["maxLength"]
    long = "word " * bound
    text = json.dumps({"correctness": 4, "relevance": 5, "helpfulness": 3,
                       "correctness_rationale": "fine", "relevance_rationale": long,
                       "helpfulness_rationale": "ok"})  # fmt: skip
    with pytest.raises(ValueError, match="relevance_rationale: at most"):
        schemas.read(q, text)  # the full check, unchanged without clip
    r = schemas.read(q, text, clip=True)
    assert r.clipped == ("answer.relevance_rationale",) and not r.cut
    kept = r.value["relevance_rationale"]
    assert len(kept) <= bound and kept.endswith("word") and long.startswith(kept)


def test_every_prefix_of_an_answer_reads_or_names_what_is_missing():
    """A cut anywhere: decisions whole -> a value, marked cut; else a ValueError (never
    another exception, never a wrong decision)."""
    q = schemas.quality_schema(1024)
    answer = {"correctness": 4, "relevance": 5, "helpfulness": 3,
              "correctness_rationale": 'Says "water" \\ twice, caf\u00e9 \U0001f33f.',
              "relevance_rationale": "On topic.", "helpfulness_rationale": "Helps."}  # fmt: skip
    for ascii_only in (True, False):
        for indent in (None, 2):
            text = json.dumps(answer, ensure_ascii=ascii_only, indent=indent)
            for cut in range(len(text)):
                try:
                    r = schemas.read(q, text[:cut], cut=True)
                except ValueError as exc:
                    assert str(exc).startswith("answer")
                    continue
                assert r.cut
                for d in ("correctness", "relevance", "helpfulness"):
                    assert r.value[d] == answer[d]
                for d in ("correctness", "relevance", "helpfulness"):
                    assert answer[f"{d}_rationale"].startswith(r.value[f"{d}_rationale"])
            assert schemas.read(q, text, cut=True).value == answer  # whole: as it is


def test_a_cut_rubric_keeps_its_whole_items():
    r = schemas.rubric_schema(2, 4, 2048)
    items = [{"aspect": f"Aspect number {i}", "evidence": "e", "reason": "r"} for i in range(3)]
    text = json.dumps({"aspects": items})
    cut = text[: text.index("Aspect number 2") + 5]
    assert schemas.read(r, cut, cut=True).value == {"aspects": items[:2]}
    too_early = text[: text.index("Aspect number 1") + 5]
    with pytest.raises(ValueError, match="at least 2 items"):
        schemas.read(r, too_early, cut=True)
    with pytest.raises(ValueError, match="not valid JSON"):
        schemas.read(r, cut)  # not read as cut: an error, as before
