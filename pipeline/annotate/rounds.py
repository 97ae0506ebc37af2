"""Reading what the annotation rounds decided, for commands outside this package.

``prb publish`` asks here for each pair's latest human verdict and for each round's
agreement figures; the round files' names and shapes stay the annotate package's business
(``importer`` writes them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.io import read_json
from pipeline.run import RunDir

# A pair's status after a round: what the votes decided (importer.py writes it). Every
# module that reads or writes one names it by these.
VERIFIED, REFUTED, UNRESOLVED = STATUSES = ("verified", "refuted", "unresolved")


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of a JSONL file the project wrote; damage is one error."""
    with open(path, "rb") as fh:
        for line, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except ValueError:  # UnicodeDecodeError is a ValueError
                raise InputError(
                    "not valid JSON; run `prb annotate import` for this round again",
                    path=path,
                    line=line,
                ) from None
            if not isinstance(row, dict):
                raise InputError("a row must be a JSON object", path=path, line=line)
            yield line, row


def latest_verdicts(rd: RunDir) -> dict[str, dict[str, Any]]:
    """Latest human verdict per pair_id over all annotation rounds (a later round wins),
    each with the ``round`` it came from."""
    latest: dict[str, dict[str, Any]] = {}
    for rnd in rd.rounds():
        path = rnd.verdicts
        if not path.exists():
            continue
        for line, row in _jsonl_rows(path):
            if not row.get("pair_id"):
                raise InputError("verdict row without a pair_id", path=path, line=line)
            if row.get("status") not in STATUSES:
                raise InputError(
                    f"status must be one of {', '.join(STATUSES)}, got {row.get('status')!r}",
                    path=path,
                    line=line,
                    field="status",
                )
            latest[row["pair_id"]] = {**row, "round": rnd.number}
    return latest


def _agreement_summary(raw: dict[str, Any]) -> dict[str, Any]:
    """The round-level figures of an agreement.json, without per-item or per-annotator
    detail: annotator names and single votes do not belong in a public release."""
    keep = (
        "items",
        "annotators",
        "annotations",
        "items_with_2plus",
        "krippendorff_alpha",
        "raw_agreement",
    )
    out = {k: raw.get(k) for k in keep if k in raw}
    hvj = raw.get("human_vs_judge")
    if isinstance(hvj, dict):
        out["human_vs_judge"] = {k: hvj.get(k) for k in ("n", "agreement", "kappa")}
    gold = raw.get("gold_accuracy")
    if raw.get("gold_accuracy_overall") is not None:
        out["gold_accuracy"] = raw["gold_accuracy_overall"]
    elif isinstance(gold, dict):  # per annotator: keep only the mean
        accs = [
            float(v["accuracy"])
            for v in gold.values()
            if isinstance(v, dict) and v.get("accuracy") is not None
        ]
        out["gold_accuracy"] = sum(accs) / len(accs) if accs else None
    return out


def agreement_summaries(rd: RunDir) -> dict[str, dict[str, Any]]:
    """Round name -> the public summary figures of each round's agreement.json."""
    out = {}
    for rnd in rd.rounds():
        path = rnd.agreement
        if path.exists():
            try:
                raw = read_json(path)
            except ValueError as exc:
                raise InputError(f"not valid JSON: {exc}", path=path) from None
            out[rnd.name] = _agreement_summary(raw if isinstance(raw, dict) else {})
    return out


def why_unverified(rd: RunDir, verdicts: dict[str, dict[str, Any]], pairs: int) -> str:
    """Why kept pairs have no "verified" verdict, in words for ``prb publish --policy
    verified``: pairs no round has imported, and unresolved pairs with fewer votes than the
    ``annotation.min_votes`` their round was imported with (the most they have)."""
    min_votes: dict[int, int] = {}
    for rnd in rd.rounds():
        try:
            raw = read_json(rnd.agreement)
            min_votes[rnd.number] = int(raw["counts"]["min_votes"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    unresolved = [v for v in verdicts.values() if v.get("status") == UNRESOLVED]
    short = [
        v
        for v in unresolved
        if v.get("round") in min_votes and 0 < int(v.get("n_votes") or 0) < min_votes[v["round"]]
    ]
    none = [v for v in unresolved if not v.get("n_votes")]
    parts = []
    if short:
        need = sorted({min_votes[v["round"]] for v in short})
        most = max(int(v.get("n_votes") or 0) for v in short)
        parts.append(
            f"{len(short)} unresolved pairs have fewer votes than annotation.min_votes "
            f"({', '.join(map(str, need))} when their round was imported; the most any has is "
            f"{most}): have more annotators vote on them, or import the round again with "
            f"--set annotation.min_votes={max(most, 1)}"
        )
    if none:
        parts.append(f"{len(none)} pairs of imported rounds have no vote yet")
    if len(unresolved) > len(short) + len(none):
        parts.append(
            f"{len(unresolved) - len(short) - len(none)} unresolved pairs have no clear "
            "majority or conflicting copies (adjudication.jsonl)"
        )
    unannotated = pairs - len([v for v in verdicts.values() if v.get("status")])
    if unannotated > 0:
        parts.append(
            f"{unannotated} kept pairs are in no imported round (`prb annotate export` and "
            "`prb annotate import` a round first)"
        )
    return "; ".join(parts)
