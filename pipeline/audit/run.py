"""``audit()``: load a source, run every check and figure, write the report; plus the
``--fail-on`` gate the CLI turns into an exit code."""

from __future__ import annotations

import difflib
import time
from pathlib import Path
from typing import Any

from pipeline.audit.checks import PROBE_GATE
from pipeline.audit.figures import Judge, analyse
from pipeline.audit.load import load_pairs
from pipeline.audit.report import flags_jsonl, render_html, write_files
from pipeline.core.errors import InputError, PipelineError
from pipeline.publish.recorded import recorded_rules
from pipeline.publish.validity import claims
from pipeline.rules import RuleSet, audit_checks
from pipeline.run import RunDir, default_eval_root, run_of
from pipeline.run.layout import RELEASE_SUMMARY
from pipeline.run.outputs import check_output, enclosing_run, run_role

GATE_ANY = "any"
# The exit code of `prb audit --fail-on` when the gate fails (1 is an error, 2 a usage error).
GATE_EXIT = 3


class AuditGateError(PipelineError):
    """Raised by callers that want an exception when the gate fails (the CLI uses the code)."""


def parse_fail_on(spec: str | None) -> set[str] | None:
    """``any`` or a comma-separated list of check codes (and ``shortcut_probe``)."""
    if spec is None:
        return None
    names = {s.strip() for s in spec.split(",") if s.strip()}
    if not names:
        raise InputError("give check codes or 'any'", field="--fail-on")
    known = [*audit_checks(), PROBE_GATE, GATE_ANY]
    for name in sorted(names):
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise InputError(
                f"unknown check '{name}'.{hint} Known: {', '.join(known)}", field="--fail-on"
            )
    return names


def gate(fig: dict[str, Any], fail_on: set[str] | None) -> list[str]:
    """Why the gate fails, read from the audit's ``verdict`` (the decision the headline
    shows): each of its reasons that ``fail_on`` names (``any``: all of them), so a check
    that fired, the probe when it flagged, and the probe when the set is too small to
    clear; and each named check that did not run on this source, which cannot clear it
    either."""
    if not fail_on:
        return []
    v = fig["verdict"]
    every = GATE_ANY in fail_on
    out = [r["text"] for r in v["reasons"] if every or r["gate"] in fail_on]
    for code in audit_checks():
        if code in fail_on and code in v["checks"]["not_run"]:
            out.append(
                f"{code} did not run ({v['checks']['not_run'][code]}), so it cannot clear this set"
            )
    return out


def _run_of(path: Path, source: dict[str, Any]) -> RunDir | None:
    """The run a source belongs to (a run directory, or its release folder), if any."""
    return run_of(Path(source["path"])) or run_of(path)


def resolve_rules(
    path: Path, source: dict[str, Any], config: Any = None, word_cap: int | None = None
) -> tuple[RuleSet, str]:
    """The rules' thresholds and patterns, and where they came from: ``config`` (a Config
    or a YAML path), else the rules a release records (release.json, wherever the release
    lies), else the run's own run.yaml, else the config defaults; ``word_cap`` overrides the
    cap."""
    from pipeline.config import Config, load_config

    origin = "the config defaults"
    cfg = None
    rules: RuleSet | None = None
    recorded = source.get("_recorded") or {}
    if isinstance(config, Config):
        cfg, origin = config, "the given config"
    elif config is not None:
        cfg, origin = load_config(Path(config)), str(config)
    elif recorded.get("summary") is not None and (
        got := recorded_rules(recorded["summary"], Path(recorded["folder"]))
    ):
        rules = got[0]
        origin = f"the rules recorded in {Path(recorded['folder']) / RELEASE_SUMMARY}"
    else:
        rd = _run_of(path, source)
        if rd is not None and rd.config_path.is_file():
            try:
                cfg, origin = rd.load_config(), str(rd.config_path)
            except PipelineError:
                origin = f"the config defaults ({rd.config_path} could not be read)"
    if rules is None:
        rules = RuleSet(cfg.pairs, cfg.responses.word_cap) if cfg is not None else RuleSet()
    if word_cap is not None:
        if word_cap < 1:
            raise InputError(f"must be at least 1, got {word_cap}", field="--word-cap")
        rules = rules.with_word_cap(word_cap)
        origin += f", word cap {word_cap} from --word-cap"
    return rules, origin


# what `prb audit` writes into its report folder
REPORT_FILES = ("audit.json", "audit.html", "flags.jsonl", "flags-compare.jsonl")
_FLAG_KEYS = {"id", "check", "detail", "side", "category", "excerpt", "row"}


def check_report_folder(out: Path, reads: list[tuple[str, Path]]) -> None:
    """The report folder and each file the audit writes there, through the one check of
    outputs (:func:`pipeline.run.outputs.check_output`): never a run's own files, the
    pairs being read, or a file of these names that `prb audit` did not write."""
    check_output(out, flag="--out", command="prb audit", folder=True, reads=reads)
    if out.is_dir():
        for name in REPORT_FILES:
            check_output(out / name, flag="--out", command="prb audit", ours=_written_by_audit)


def _written_by_audit(path: Path) -> bool:
    """Whether ``path`` is a report file `prb audit` wrote (its shape, by name)."""
    import json

    try:
        text = path.read_text(encoding="utf-8")
        if path.name == "audit.html":
            return 'id="figures"' in text and text.startswith("<!")
        if path.name == "audit.json":
            raw = json.loads(text)
            return isinstance(raw, dict) and {"checks", "verdict", "source"} <= raw.keys()
        return all(
            isinstance(obj := json.loads(line), dict) and set(obj) == _FLAG_KEYS
            for line in text.splitlines()
            if line.strip()
        )
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False


def _default_out(path: Path, source: dict[str, Any]) -> Path:
    """A run's report/ folder for a run or its release; else beside the input."""
    rd = _run_of(path, source)
    if rd is not None:
        return rd.report_dir
    return path.with_name(f"{path.stem if path.is_file() else path.name}-audit")


def audit(
    path: str | Path,
    out_dir: str | Path | None = None,
    judge: Judge | None = None,
    *,
    compare: str | Path | None = None,
    config: Any = None,
    word_cap: int | None = None,
    timings: dict[str, float] | None = None,
    stale_ok: bool = False,
) -> dict[str, Any]:
    """Audit a pairs source; write ``audit.html``, ``audit.json`` and ``flags.jsonl`` under
    ``out_dir`` (default: beside the input, or the run's ``report/``).

    ``judge`` is an optional rubric-blind judge for the leakage figure on sets without judge
    columns. ``compare`` audits a second source with the same rules and puts both side by
    side. ``config`` (a Config or a run config path) and ``word_cap`` set the rules (else
    the rules a release records). A release its run no longer supports is refused unless
    ``stale_ok``. Returns the figures, plus ``outputs`` with the written paths. Nothing is
    written on error.
    """
    timings = {} if timings is None else timings
    clock = time.perf_counter()
    path = Path(path)
    out = Path(out_dir) if out_dir is not None else None
    reads = [("the pairs being audited", path)]
    if compare is not None:
        reads.append(("the pairs compared with", Path(compare)))
    if out is not None:
        check_report_folder(out, reads)
    rows, source = load_pairs(path, stale_ok=stale_ok, compact=True)
    timings["load_s"] = round(time.perf_counter() - clock, 3)
    rules, origin = resolve_rules(path, source, config, word_cap)
    figures, flags = analyse(rows, source, judge, rules=rules, timings=timings)
    figures["checks"]["rules"]["from"] = origin
    figures["validity"] = _validity(path, source, figures)
    del rows
    compare_flags: list[dict[str, Any]] = []
    if compare is not None:
        other_rows, other_source = load_pairs(Path(compare), stale_ok=stale_ok, compact=True)
        other, compare_flags = analyse(other_rows, other_source, None, rules=rules)
        other["checks"]["rules"]["from"] = origin
        figures["compare"] = other
    clock = time.perf_counter()
    if out is None:
        out = _default_out(path, source)
        run = enclosing_run(out)
        if run is not None and run_role(out) is not None:
            # beside a file inside a run's own folders (a release's parquet file): the run's
            # report folder, never a folder of the release or of a stage
            out = RunDir(run).report_dir
        check_report_folder(out, reads)
    files = {
        "audit.json": _json_file(figures),
        "audit.html": render_html(figures),
        "flags.jsonl": flags_jsonl(flags),
    }
    if compare is not None:
        files["flags-compare.jsonl"] = flags_jsonl(compare_flags)
    timings["render_s"] = round(time.perf_counter() - clock, 3)
    clock = time.perf_counter()
    write_files(out, files)
    timings["write_s"] = round(time.perf_counter() - clock, 3)
    outputs = {
        "html": str(out / "audit.html"),
        "json": str(out / "audit.json"),
        "flags": str(out / "flags.jsonl"),
    }
    if compare is not None:
        outputs["flags_compare"] = str(out / "flags-compare.jsonl")
    return {**figures, "outputs": outputs}


def _validity(path: Path, source: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    """The release's validity claims (pipeline/publish/validity.py), read from the outputs
    made for it; this audit's own probe for the probe's claim."""
    if source.get("format") != "release":
        return {"claims": [], "note": "the validity claims are read for a published release"}
    release = Path(source["path"])
    rd = _run_of(path, source)
    recorded = (source.get("_recorded") or {}).get("summary") or {}
    return claims(
        release,
        eval_root=default_eval_root(release),
        agreement_files=[(rnd.name, rnd.agreement) for rnd in rd.rounds()] if rd else (),
        recorded_agreement=recorded.get("agreement"),
        own_probe=figures.get("shortcut_probe") or {},
        shown_as=str(path),
        run_as=rd.shown if rd else "RUN",
    )


def _json_file(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
