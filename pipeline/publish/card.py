"""The dataset card (README.md) of a release: its YAML header, which the Hub and
``datasets`` read (configs and their data files, license, sizes), and its prose, rendered
from a template shipped inside the package with the figures ``release.json`` also holds
(:mod:`pipeline.publish.summary`)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from pipeline.core.fields import show
from pipeline.core.io import file_digest
from pipeline.publish.validity import rows as validity_rows
from pipeline.release.columns import json_text

# The name of each config's one data file (a test split, as the reference's).
DATA_FILE = "test-00000-of-00001.parquet"
# The reference release's subsets (its Hub configs, QiyaoMa/Personalized-RewardBench, and
# the --subset choices of its evaluation scripts): our category configs carry these names
# when the input's categories are LaMP-QA's.
REFERENCE_SUBSETS = (
    "Art_and_Entertainment",
    "Lifestyle_and_Personal_Development",
    "Society_and_Culture",
)
# The card's prose: a template file inside the package (shipped in the wheel).
CARD_TEMPLATE = "templates/dataset_card.md.j2"


def _size_category(n: int) -> str:
    for bound, label in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K")):
        if n < bound:
            return label
    return "100K<n<1M" if n < 1_000_000 else "n>1M"


def config_name(category: str | None) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", category or "").strip("_.-")
    return name or "uncategorized"


def data_file_digests(folder: Path, configs: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per config: its data file's path in the release, sha256 and size in bytes."""
    out = {}
    for name in configs:
        path = f"{name}/{DATA_FILE}"
        digest, size, _ = file_digest(folder / path)
        out[name] = {"path": path, "sha256": digest, "bytes": size}
    return out


def card_configs(configs: dict[str, int], data_files: dict[str, dict[str, Any]]) -> list[dict]:
    """The card's YAML ``configs``: one per config, ``all`` the default.

    Each config's ``description`` names its data file's sha256, and that is what keeps one
    release's rows from being served for another's. ``datasets`` caches a local folder
    under ``<cache>/<folder name>/<config>/0.0.0/<hash>``, and for a folder whose card lists
    ``configs`` that hash covers the card's ``dataset_info`` and the configs as written
    (names, relative file patterns, builder parameters), not the files' paths, sizes or
    dates: two releases in folders of one name, or one folder published again, would
    share a cache entry. ``description`` is a builder parameter, so the digest enters the
    hash, and every load names the content it wants without passing anything more.
    """
    return [
        {
            "config_name": name,
            "data_files": [{"split": "test", "path": data_files[name]["path"]}],
            "description": f"{n} pairs; data file sha256 {data_files[name]['sha256']}",
            **({"default": True} if name == "all" else {}),
        }
        for name, n in configs.items()
    ]


def render_card(summary: dict[str, Any]) -> str:
    """README.md with the YAML header the Hub reads (configs, license, sizes)."""
    import yaml

    configs = card_configs(summary["configs"], summary["data_files"])
    header = {
        "license": summary["license"],
        "pretty_name": summary["pretty_name"],
        "language": ["en"],
        "task_categories": ["text-classification", "question-answering"],
        "size_categories": [_size_category(summary["rows"])],
        "tags": ["reward-modeling", "personalization", "preference", "rlhf"],
        "configs": configs,
    }
    import jinja2

    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )
    text = resources.files("pipeline").joinpath(CARD_TEMPLATE).read_text(encoding="utf-8")
    template = env.from_string(text)
    prov = summary["provenance"]
    categories = [name for name in summary["configs"] if name != "all"]
    present = [name for name in REFERENCE_SUBSETS if name in categories]
    return template.render(
        header=yaml.safe_dump(header, sort_keys=False, allow_unicode=True).rstrip(),
        s=summary,
        reference_subsets=REFERENCE_SUBSETS,
        example_subset=(present or categories or ["all"])[0],
        missing_subsets=[name for name in REFERENCE_SUBSETS if name not in categories],
        other_configs=[name for name in categories if name not in REFERENCE_SUBSETS],
        p=prov,
        funnel=summary.get("funnel") or {},
        filter_rows=_filter_rows(prov.get("filters"), prov.get("rules")),
        version_rows=_version_rows(prov.get("environment"), prov.get("publish_environment")),
        validity_rows=validity_rows(summary.get("validity") or {}),
        fmt=show,
        cell=_cell,
        code=_code,
        json=json_text,
    )


def _cell(x: Any) -> str:
    """A value as one Markdown table cell: a pipe or a line break would split the row."""
    return show(x).replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """Inline code that survives backticks inside the text."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _filter_rows(settings: Any, rules: Any = None) -> list[tuple[str, str]]:
    """The pair stage's settings as (name, value) table rows, then the word cap they were
    applied with; pattern lists by their count (release.json has them in full)."""
    if not isinstance(settings, dict):
        return []
    cap = rules.get("word_cap") if isinstance(rules, dict) else None
    if cap is not None:
        settings = {**settings, "word_cap (responses)": cap}
    rows = []
    for name, value in settings.items():
        if isinstance(value, list) and name.endswith("_patterns"):
            shown = f"{len(value)} regular expressions (in release.json)"
        elif isinstance(value, list):
            shown = ", ".join(_code(str(v)) for v in value) or "none"
        elif isinstance(value, dict):
            shown = _code(json_text(value))
        elif isinstance(value, float):
            shown = f"{value:g}"
        else:
            shown = _cell(value)
        rows.append((name, shown))
    return rows


def _version_rows(run: Any, publish: Any) -> list[tuple[str, Any, Any]]:
    """(library, version in the run, version at publish), the run's order first; names
    compared as pip does (huggingface_hub is huggingface-hub)."""

    def canon(d: Any) -> dict[str, Any]:
        d = d if isinstance(d, dict) else {}
        keep = ("vllm_verified_with",)  # not a package name
        return {k if k in keep else k.lower().replace("_", "-"): v for k, v in d.items()}

    run, publish = canon(run), canon(publish)
    names = list(run) + [k for k in publish if k not in run]
    return [
        (
            k,
            json_text(run[k]) if isinstance(run.get(k), dict | list) else run.get(k),
            publish.get(k),
        )
        for k in names
    ]
