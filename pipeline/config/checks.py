"""Checks run on a validated config before anything else happens: settings that contradict
each other, paths that are not what they must be, schemas that do not fit their max_tokens.
Each raises one ConfigError naming the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pipeline.config.sections import PROMPT_FILE_OPTIONAL, PROMPT_FILE_USES, Config
from pipeline.core.errors import ConfigError, InputError
from pipeline.core.io import path_kind
from pipeline.inputs import FORMATS
from pipeline.rules import RULES
from pipeline.types.promptfiles import read_prompt_files
from pipeline.types.schemas import check_budgets


def check_input_path(
    path: Path,
    want: Literal["file", "folder or parquet file"],
    *,
    field: str,
    source: str,
    what: str = "a JSONL file",
) -> None:
    """Refuse an existing input path that is not what ``want`` says, before anything opens
    it: a named pipe or a device would be read forever. A missing path is left to the
    reader, which says so."""
    kind = path_kind(path)
    if kind is None or (kind == "a file" and want == "file"):
        return
    if want == "folder or parquet file" and (
        kind == "a folder" or (kind == "a file" and path.suffix.lower() == ".parquet")
    ):
        if kind == "a folder":
            # datasets reads every file of the folder: a pipe in it hangs as well
            for inner in sorted(path.rglob("*")):
                inner_kind = path_kind(inner)
                if inner_kind not in ("a file", "a folder", None):
                    raise ConfigError(
                        f"{inner} in the dataset folder is {inner_kind}, not a file; "
                        "remove it or point input.path at a clean copy",
                        path=source,
                        field=field,
                    )
        return
    if want != "file":
        what = "a `datasets` folder or a .parquet file"
    raise ConfigError(
        f"{path} is {kind}, not {what}; point {field} at {what}", path=source, field=field
    )


def check_input_paths(cfg: Config, source: str) -> None:
    """Every input path the config names is what its format reads (nothing is read yet)."""
    for field, p, want in FORMATS.get(cfg.input.format).path_fields(cfg.input):
        resolved = cfg.resolve_input(p)
        if resolved is not None:
            try:
                check_input_path(resolved, want, field=field, source=source)
            except ConfigError as exc:
                other = FORMATS.detect(resolved)
                if other is None or other == cfg.input.format:
                    raise
                hint = f"; it looks like input.format '{other}'"
                raise ConfigError(exc.reason + hint, path=source, field=field) from None
    section = cfg.backend.section()
    for field, p, what in section.input_files() if section is not None else []:
        resolved = cfg.resolve_input(p)
        if resolved is not None:
            check_input_path(resolved, "file", field=field, source=source, what=what)


def check_consistency(cfg: Config, source: str) -> None:
    """Settings that are valid one by one but contradict each other (every pair would drop)."""
    r, p = cfg.rubrics, cfg.pairs
    prices = cfg.run.prices
    # each pair of rates is given whole or not at all: standard, then batch
    for prefix in ("", "batch_"):
        pair = [getattr(prices, f"{prefix}{side}_usd_per_million") for side in ("input", "output")]
        given = [x is not None for x in pair]
        if any(given) and not all(given):
            missing = "input" if not given[0] else "output"
            raise ConfigError(
                f"give both run.prices.{prefix}input_usd_per_million and "
                f"{prefix}output_usd_per_million (0 for a side that is free), or neither",
                path=source,
                field=f"run.prices.{prefix}{missing}_usd_per_million",
            )
    standard = (prices.input_usd_per_million, prices.output_usd_per_million)
    if cfg.run.budget.usd is not None and None in standard:
        raise ConfigError(
            "run.budget.usd needs the backend's prices: set run.prices.input_usd_per_million "
            "and output_usd_per_million",
            path=source,
            field="run.budget.usd",
        )
    if cfg.responses.sampling.max_tokens is None:
        raise ConfigError(
            "must be a number of tokens: an answer in prose has no schema to bound it",
            path=source,
            field="responses.sampling.max_tokens",
        )
    if r.min_items > r.max_items:
        raise ConfigError(
            f"rubrics.min_items ({r.min_items}) exceeds rubrics.max_items ({r.max_items}); "
            "lower min_items or raise max_items",
            path=source,
            field="rubrics.min_items",
        )
    values = p.model_dump()
    for name, rule in RULES.items():
        found = rule.settings_problem(values, cfg.responses.word_cap, name in p.filters)
        if found is not None:
            field, why = found
            raise ConfigError(why, path=source, field=f"pairs.{field}")


def check_judge_off(cfg: Config, source: str) -> None:
    """With the judge off (the reference's construction) no filter may need a verdict."""
    if cfg.judge.enabled:
        return
    needing = [n for n in cfg.pairs.filters if RULES.get(n).reads_verdicts]
    if needing:
        raise ConfigError(
            f"judge.enabled is false, but the filters {', '.join(needing)} read the judge's "
            "verdicts; remove them from pairs.filters or turn the judge on",
            path=source,
            field="pairs.filters",
        )


def check_prompt_files(cfg: Config, source: str) -> None:
    """The prompt files ``prompts`` names exist and hold the placeholders their use needs
    (read now, not after the rubric stage's requests)."""
    p = cfg.prompts
    if p.dir is not None and not p.files:
        raise ConfigError(
            "prompts.dir is set, but prompts.files names no file; map each prompt to its "
            "file, e.g. prompts.files: {chosen: chosen.txt, avoid_all: rejected.txt}",
            path=source,
            field="prompts.files",
        )
    try:
        read_prompt_files(
            cfg.resolve_input(p.dir),
            {str(k): v for k, v in p.files.items()},
            PROMPT_FILE_USES,
            PROMPT_FILE_OPTIONAL,
        )
    except InputError as exc:
        if exc.path is None:  # no folder: the config's own field
            raise ConfigError(exc.reason, path=source, field=exc.field) from None
        raise


def check_output_dir(cfg: Config, source: str) -> None:
    """run.output_dir (and the run directory in it) must be folders, or not exist yet."""
    for p in (Path(cfg.run.output_dir), cfg.run_dir):
        probe = p
        # the first part of the path that exists must be a folder
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            field = "run.output_dir" if p != cfg.run_dir else "run.name"
            raise ConfigError(
                f"{probe} is a file, not a folder; point run.output_dir at a folder "
                "(or move the file away)",
                path=source,
                field=field,
            )


def check_schema_budgets(cfg: Config, source: str) -> None:
    """Every JSON schema a stage sends must fit its max_tokens (see pipeline/types/schemas.py):
    found now, not after an hour of cut-off answers."""
    problems = check_budgets(cfg)
    if problems:
        field, why = problems[0]
        raise ConfigError(why, path=source, field=field)
