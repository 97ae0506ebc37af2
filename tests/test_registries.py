"""Every kind the project extends is held by one registry class (pipeline/core/registry.py): each
refuses a name taken twice, an object that is not a class, a class of the wrong base and a
class whose own name differs, and answers an unknown name with the closest one. One test
per kind, over the live registries."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.core.errors import ConfigError
from pipeline.core.registry import Registry
from pipeline.inputs import FORMATS, InputFormat
from pipeline.kinds.backend import BACKENDS, Backend
from pipeline.rules import RULES, PairRule
from pipeline.stages import STAGES
from pipeline.stages.base import Stage


def _kinds() -> list[tuple[Registry[Any], type, str]]:
    """(registry, its base, the attribute holding an entry's name)."""
    from pipeline.eval.pointwise import ENGINES, RMEngine
    from pipeline.eval.spec import SCORERS, ScorerKind
    from pipeline.kinds.dialect import DIALECTS, StructuredOutput

    return [
        (BACKENDS, Backend, "name"),
        (DIALECTS, StructuredOutput, "name"),
        (FORMATS, InputFormat, "name"),
        (RULES, PairRule, "name"),
        (STAGES, Stage, "name"),
        (SCORERS, ScorerKind, "name"),
        (ENGINES, RMEngine, "name"),
    ]


KIND_NAMES = [
    "backend", "dialect", "input format", "pair rule", "stage", "scorer",
    "reward-model engine",
]  # fmt: skip


@pytest.fixture(params=range(len(KIND_NAMES)), ids=KIND_NAMES)
def kind(request) -> tuple[Registry[Any], type, str]:
    return _kinds()[request.param]


def test_the_registries_are_one_class_and_know_their_kind(kind):
    registry, base, _ = kind
    assert isinstance(registry, Registry)
    assert registry.base is base
    assert registry.names(), f"no {registry.kind} registered"


def test_a_taken_name_is_refused(kind):
    registry, _, _ = kind
    name = registry.names()[0]
    before = registry.get(name)
    with pytest.raises(ValueError, match=f"{registry.kind} '{name}' is already registered"):
        registry.register(name, before)
    assert registry.get(name) is before


def test_a_non_class_and_a_wrong_base_are_refused(kind):
    registry, _, _ = kind
    with pytest.raises(TypeError):
        registry.register("a-dict", {"name": "a-dict"})
    with pytest.raises(TypeError, match="is not a"):
        registry.register("an-int", int)
    assert "a-dict" not in registry and "an-int" not in registry


def test_an_entry_named_otherwise_is_refused_and_an_unnamed_one_is_named(kind):
    registry, base, attr = kind
    other = registry.get(registry.names()[0])
    with pytest.raises(TypeError, match=f"its {attr} is '{getattr(other, attr)}'"):
        registry.register("another-name", other)
    fresh = type("Fresh", (base,), {attr: ""})
    try:
        assert registry.register("fresh-entry", fresh) is fresh
        assert getattr(fresh, attr) == "fresh-entry"
        assert registry.get("fresh-entry") is fresh
    finally:
        registry.unregister("fresh-entry")
    assert "fresh-entry" not in registry


def test_an_unknown_name_suggests_the_closest(kind):
    registry, _, _ = kind
    name = registry.names()[0]
    typo = name + "x"
    with pytest.raises(ConfigError) as err:
        registry.check(typo)
    assert f"Did you mean '{name}'?" in str(err.value)
    assert registry.kind in str(err.value)


def test_a_lazy_entry_is_checked_when_imported():
    reg: Registry[type] = Registry("widget", Backend)
    reg.register("not-a-backend", "pipeline.run.cache:RequestCache")
    with pytest.raises(TypeError, match=r"is not a subclass of pipeline\.kinds\.backend\.Backend"):
        reg.get("not-a-backend")


def test_the_backend_sections_are_the_registered_backends_settings():
    """``BackendSection`` keeps one typed field per backend section (so the code reading
    ``cfg.backend.openai`` is type-checked); this is what keeps that list true: each
    section is the ``settings`` class of the registered backend of its name, and every
    registered backend with settings has its section."""
    from pipeline.kinds.backend import BackendSection

    fields = BackendSection.model_fields
    with_settings = {n for n in BACKENDS.names() if BACKENDS.get(n).settings is not None}
    assert set(BackendSection().sections()) == with_settings
    for name in with_settings:
        assert fields[name].annotation is BACKENDS.get(name).settings, name
