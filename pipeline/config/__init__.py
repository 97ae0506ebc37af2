"""Run configuration: one YAML file per run, validated with pydantic.

Every field has a type, a default where one makes sense and a one-line description
(``prb config show`` prints them resolved). Unknown keys and bad values fail at load
time with the file and the dotted field name. Secrets never live here: the config
names the environment variable that holds a key, never the key.

One concern a module: ``sections`` (the section models and ``Config``), ``yamlfile``
(reading the YAML: duplicate keys, alias loops and bombs, plain values only),
``overrides`` (``--set`` and the once-flat backend keys), ``checks`` (cross-field and
path checks after validation), ``load`` (the whole of loading), ``describe`` (every
field, for docs/config.md and ``prb config show``). The names importers use are here.
"""

from __future__ import annotations

from pipeline.config.checks import check_input_path
from pipeline.config.describe import describe_fields
from pipeline.config.load import config_from_overrides, load_config
from pipeline.config.overrides import PATH_FIELDS, apply_overrides, parse_override
from pipeline.config.sections import (
    STRATEGIES,
    AnnotationSection,
    BudgetSection,
    Config,
    InputSection,
    JudgeSection,
    PairsSection,
    PricesSection,
    ProfileSection,
    ResponsesSection,
    RubricsSection,
    RunSection,
    SamplingSection,
    Strategy,
    pairs_model,
    pairs_section,
)
from pipeline.config.yamlfile import ConfigLoader, DuplicateKeyError
from pipeline.kinds.backend import BackendSection

__all__ = [
    "PATH_FIELDS",
    "STRATEGIES",
    "AnnotationSection",
    "BackendSection",
    "BudgetSection",
    "Config",
    "ConfigLoader",
    "DuplicateKeyError",
    "InputSection",
    "JudgeSection",
    "PairsSection",
    "PricesSection",
    "ProfileSection",
    "ResponsesSection",
    "RubricsSection",
    "RunSection",
    "SamplingSection",
    "Strategy",
    "apply_overrides",
    "check_input_path",
    "config_from_overrides",
    "describe_fields",
    "load_config",
    "pairs_model",
    "pairs_section",
    "parse_override",
]
