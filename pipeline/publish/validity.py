"""A release's validity, as the outputs made for it state it: one section of the dataset
card and of ``prb audit``'s report.

The reference benchmark makes two claims about what it built: its pairs differ by personal
preference alone, and a reward model's accuracy on it predicts that model's downstream
performance. Each claim here is read from the files the project's commands wrote for this
release, never computed a second way, and names those files with their SHA-256; a claim no
file measures says "not measured" with the command that measures it:

- rubric-blind judge accuracy: ``prb eval``'s judges with the question only
  (``<eval root>/<judge>/question/results.json``): near 0.5 when the pairs differ by
  preference alone;
- rubric-aware judge accuracy: the same judges shown the rubric (the ``rubric`` control);
- profile gain: accuracy with the profile minus without, every scorer evaluated on both
  (``.../profile/results.json``);
- shortcut-probe AUC: ``prb audit``'s probe (``report/audit.json``);
- human agreement: Krippendorff's alpha of each annotation round (``annotate/round-N/
  agreement.json``, or the figures ``release.json`` recorded from them);
- downstream correlation: ``prb eval bon``'s best-of-N table correlated by ``prb eval
  correlate`` (``<eval root>/bon/correlate-<setting>.json``).

A file is "made for this release" when it records the SHA-256 of the release's ``all`` data
file (``split.data_sha256`` in prb eval's and prb eval bon's results, ``source.data_sha256``
in audit.json): a file made on another release, or before releases were identified so, is
not read. Only file names, hashes and figures go into the section: no path of the user's
machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipeline.core.io import file_digest
from pipeline.run.layout import RELEASE_ALL

DATA_FILE = "test-00000-of-00001.parquet"  # as pipeline.publish.card names it
CLAIMS = {
    "rubric_blind_judge_accuracy": "rubric-blind judge accuracy (question only; near 0.5 "
    "when the pairs differ by personal preference alone)",
    "rubric_aware_judge_accuracy": "rubric-aware judge accuracy (the rubric shown: a control, "
    "near 1 when the chosen answer follows the rubric)",
    "profile_gain": "profile gain (accuracy with the profile minus without)",
    "shortcut_probe_auc": "shortcut-probe AUC (surface features alone; near 0.5 when nothing "
    "gives the chosen answer away)",
    "human_agreement": "human agreement (Krippendorff's alpha of an annotation round)",
    "downstream_correlation": "downstream correlation (benchmark accuracy against best-of-N "
    "scores, across reward models)",
}


def release_sha256(release: Path) -> str | None:
    """The SHA-256 of a release's ``all`` data file: what identifies the release."""
    data = Path(release) / RELEASE_ALL / DATA_FILE
    if not data.is_file():
        return None
    return file_digest(data)[0]


def _read(path: Path) -> tuple[Any, str] | None:
    try:
        raw = path.read_bytes()
        doc = json.loads(raw)
    except (OSError, ValueError):
        return None
    import hashlib

    return doc, hashlib.sha256(raw).hexdigest()


def _source(path: Path, root: Path | None, sha: str) -> dict[str, str]:
    """A file as the section names it: its path under the root it was found in (no
    machine path), and its SHA-256."""
    try:
        shown = str(path.relative_to(root)) if root is not None else path.name
    except ValueError:
        shown = path.name
    return {"file": shown, "sha256": sha}


def _claim(name: str, figures: list[dict[str, Any]], command: str) -> dict[str, Any]:
    out: dict[str, Any] = {"claim": name, "label": CLAIMS[name], "figures": figures}
    if not figures:
        out["not_measured"] = command
    return out


def _eval_results(root: Path | None, sha: str) -> tuple[list[tuple[dict, dict]], int]:
    """prb eval's results files under ``root`` made for the release: (doc, source) each,
    and how many other results files were passed over."""
    found: list[tuple[dict, dict]] = []
    other = 0
    if root is None or not root.is_dir():
        return found, other
    for f in sorted(root.glob("*/*/results.json")):
        got = _read(f)
        if got is None or not isinstance(got[0], dict):
            continue
        doc, digest = got
        if (doc.get("split") or {}).get("data_sha256") != sha:
            other += 1
            continue
        found.append((doc, _source(f, root.parent, digest)))
    return found, other


def claims(
    release: Path,
    *,
    eval_root: Path | None = None,
    report_dir: Path | None = None,
    agreement_files: Iterable[tuple[str, Path]] = (),
    recorded_agreement: dict[str, Any] | None = None,
    own_probe: dict[str, Any] | None = None,
    shown_as: str = "RELEASE",
    run_as: str = "RUN",
) -> dict[str, Any]:
    """Every claim for the release at ``release``, from the outputs found: ``eval_root``
    (prb eval's and prb eval bon's), ``report_dir`` (prb audit's audit.json), the annotation
    rounds' ``agreement_files`` (name, path), else the agreement figures ``release.json``
    recorded; ``own_probe``: the shortcut probe of the audit being written (its report
    states its own figure). ``shown_as`` and ``run_as``: how commands name the release
    and its run."""
    sha = release_sha256(release)
    out: dict[str, Any] = {"release_data_sha256": sha, "claims": []}
    if sha is None:
        out["note"] = "not a release folder: claims are read for a published release"
        return out
    results, passed = _eval_results(eval_root, sha)
    blind, aware, gains = [], [], []
    for doc, src in results:
        scorer = doc.get("scorer") or {}
        for setting, block in (doc.get("settings") or {}).items():
            m = block.get("metrics") or {}
            fig = {
                "who": scorer.get("name"),
                "value": m.get("accuracy"),
                "ci95": m.get("ci95"),
                "pairs": m.get("scored"),
                **src,
            }
            if scorer.get("kind") == "pairwise" and setting == "question":
                blind.append(fig)
            if scorer.get("kind") == "pairwise" and setting == "rubric":
                aware.append(fig)
        gain = doc.get("profile_gain") or {}
        if gain.get("gain") is not None:
            gains.append({"who": scorer.get("name"), "value": gain["gain"],
                          "ci95": gain.get("ci95"), "pairs": gain.get("pairs"), **src})  # fmt: skip
    rel = shown_as
    judge = f"prb eval {rel} --scorer judge:MODEL --setting"
    out["claims"] += [
        _claim("rubric_blind_judge_accuracy", blind, f"{judge} question"),
        _claim("rubric_aware_judge_accuracy", aware, f"{judge} rubric"),
        _claim("profile_gain", gains,
               f"prb eval {rel} --scorer SPEC --setting question --setting profile"),
        _claim("shortcut_probe_auc", _probe(report_dir, sha, own_probe), f"prb audit {rel}"),
    ]  # fmt: skip
    out["claims"].append(
        _claim(
            "human_agreement",
            _agreement(agreement_files, recorded_agreement, release),
            f"prb annotate export {run_as} --round N, then prb annotate import {run_as} "
            f"--round N once annotators have voted, then prb publish {run_as}",
        )
    )
    out["claims"].append(
        _claim(
            "downstream_correlation",
            _downstream(eval_root, sha),
            f"prb eval {rel} --scorer SPEC --setting question (3 reward models or more), then "
            f"prb eval bon {rel} --scorer SPEC (the same ones)",
        )
    )
    if passed:
        out["passed_over"] = (
            f"{passed} prb eval results file(s) made on another split, or before results "
            "recorded the release they were made on, were not read"
        )
    return out


def _probe(report_dir: Path | None, sha: str, own: dict[str, Any] | None) -> list[dict[str, Any]]:
    def fig(p: dict[str, Any], src: dict[str, str]) -> dict[str, Any]:
        return {
            "who": "prb audit",
            "value": p.get("auc"),
            "chance_p95": p.get("chance_auc_p95"),
            "status": p.get("status"),
            "pairs": p.get("pairs"),
            **src,
        }

    if own is not None:
        if own.get("auc") is None:
            return []
        return [fig(own, {"file": "audit.json (this report)", "sha256": ""})]
    if report_dir is None:
        return []
    got = _read(report_dir / "audit.json")
    if got is None or not isinstance(got[0], dict):
        return []
    doc, digest = got
    if (doc.get("source") or {}).get("data_sha256") != sha:
        return []
    p = doc.get("shortcut_probe") or {}
    if p.get("auc") is None:
        return []
    return [fig(p, _source(report_dir / "audit.json", report_dir.parent, digest))]


def _agreement(
    files: Iterable[tuple[str, Path]], recorded: dict[str, Any] | None, release: Path
) -> list[dict[str, Any]]:
    out = []
    for name, path in files:
        got = _read(path)
        if got is None or not isinstance(got[0], dict):
            continue
        doc, digest = got
        if doc.get("krippendorff_alpha") is None:
            continue
        out.append({"who": name, "value": doc["krippendorff_alpha"], "ci95": None,
                    "items": doc.get("items"), "annotators": doc.get("annotators"),
                    "file": f"annotate/{name}/{path.name}", "sha256": digest})  # fmt: skip
    if out or not recorded:
        return out
    summary = Path(release) / "release.json"
    digest = file_digest(summary)[0] if summary.is_file() else ""
    for name, a in recorded.items():
        if isinstance(a, dict) and a.get("krippendorff_alpha") is not None:
            out.append({"who": name, "value": a["krippendorff_alpha"], "ci95": None,
                        "items": a.get("items"), "annotators": a.get("annotators"),
                        "file": "release.json (agreement)", "sha256": digest})  # fmt: skip
    return out


def _downstream(root: Path | None, sha: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if root is None or not root.is_dir():
        return out
    for bon in sorted([*root.glob("bon.json"), *root.glob("*/bon.json")]):
        got = _read(bon)
        if got is None or not isinstance(got[0], dict):
            continue
        doc = got[0]
        if (doc.get("split") or {}).get("data_sha256") != sha:
            continue
        for setting, table in (doc.get("tables") or {}).items():
            path = table.get("correlate")
            if not path:
                continue
            corr_path = bon.parent / Path(path).name
            got_c = _read(corr_path)
            if got_c is None or not isinstance(got_c[0], dict):
                continue
            corr, digest = got_c
            rows = corr.get("correlations") or []
            groups = {r.get("subset") for r in rows}
            group = "overall" if "overall" in groups else "all"
            for r in rows:
                if r.get("subset") != group or not r.get("metrics"):
                    continue
                if not str(r.get("downstream", "")).startswith("bon_k"):
                    continue
                m = r["metrics"]
                out.append(
                    {
                        "who": f"best-of-N, setting {setting}, {r['downstream']}, {group}",
                        "models": r.get("models"),
                        "value": (m.get("spearman") or {}).get("value"),
                        "ci95": (m.get("spearman") or {}).get("ci95"),
                        "metrics": {
                            k: {"value": v.get("value"), "ci95": v.get("ci95")}
                            for k, v in m.items()
                        },
                        "rbo_persistence": corr.get("rbo_persistence"),
                        **_source(corr_path, root.parent, digest),
                    }
                )
    return out


# ---- how the card and the report show it ---------------------------------------------


def _num(v: Any) -> str:
    return (
        "n/a"
        if v is None
        else f"{v:+.3f}"
        if isinstance(v, float) and v < 0
        else (f"{v:.3f}" if isinstance(v, float) else str(v))
    )


def _ci(ci: Any) -> str:
    if not ci or len(ci) != 2 or any(x is None for x in ci):
        return "no interval"
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def rows(section: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The section as table rows: (claim, who and figure, interval, source or command)."""
    out = []
    for c in section.get("claims") or []:
        if not c["figures"]:
            out.append((c["label"], "not measured", "", f"`{c['not_measured']}`"))
            continue
        for f in c["figures"]:
            figure = f"{f.get('who')}: {_num(f.get('value'))}"
            if c["claim"] == "downstream_correlation":
                m = f.get("metrics") or {}
                parts = []
                for key, label in (("spearman", "Spearman"), ("kendall_tau_weighted",
                                   "weighted tau"), ("ndcg", "NDCG"),
                                   ("rbo", f"RBO (p = {f.get('rbo_persistence')})")):  # fmt: skip
                    one = m.get(key) or {}
                    parts.append(f"{label} {_num(one.get('value'))} {_ci(one.get('ci95'))}")
                figure = f"{f.get('who')} ({f.get('models')} models): " + ", ".join(parts)
            if c["claim"] == "shortcut_probe_auc":
                interval = (
                    f"chance (side-swapped) 95th percentile {_num(f.get('chance_p95'))}; "
                    f"{f.get('status')}"
                )
            elif c["claim"] == "human_agreement":
                interval = "no interval (the round gives none)"
            elif c["claim"] == "downstream_correlation":
                interval = "95% bootstrap over models, each beside its figure"
            else:
                interval = _ci(f.get("ci95"))
            sha = f.get("sha256") or ""
            src = f"`{f['file']}`" + (f" (sha256 `{sha[:16]}`)" if sha else "")
            out.append((c["label"], figure, interval, src))
    return out
