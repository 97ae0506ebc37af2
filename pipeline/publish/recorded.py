"""What a release records about how it was made, and whether its run still matches it.

``release.json`` (written by ``prb publish``) carries, beside the card's figures:

- ``built_from``: the identity of every stage of the run at publish time (its fingerprint,
  from ``stage.json``, and its content id, the hash of its ``_DONE.json`` manifest) and the
  pairs it kept. A command that reads a release inside its run (``prb audit``, ``prb
  eval``) compares it with the run as it is now: when the run has moved on (a stage
  re-done, being re-done, or answered by another backend) the release no longer describes
  the run, and the command refuses with one line naming it, unless ``--stale-ok``;
- ``provenance.rules``: the pair stage's settings (``pairs`` section and ``word_cap``),
  the rules its pairs were filtered with;
- ``provenance.profile``: the profile selection the run used (ranker, top_k, model); each
  row's ``profile_view`` holds the ranking itself.

A release copied out of its run is read with what it records, wherever it lies.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.backends.identity import describe, identity_id
from pipeline.core.errors import InputError, PipelineError, RunDirError
from pipeline.core.io import read_json
from pipeline.rules import RuleSet
from pipeline.run import RunDir, StageDir
from pipeline.run.layout import RELEASE_SUMMARY

STALE_OK = "--stale-ok"


class StaleReleaseError(RunDirError):
    """A release (or a pair stage) that the run it belongs to no longer supports."""


def summary_of(folder: Path) -> dict[str, Any] | None:
    """``release.json`` of a release folder (None when it has none); damage is one
    InputError naming the file."""
    path = Path(folder) / RELEASE_SUMMARY
    try:
        raw = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        reason = "not valid JSON" if isinstance(exc, ValueError) else str(exc)
        raise InputError(
            f"{reason}; publish the release again (`prb publish RUN`)", path=path
        ) from None
    if not isinstance(raw, dict):
        raise InputError("must be a JSON object; publish the release again", path=path)
    return raw


# ---- at publish time --------------------------------------------------------------------


def stage_identity(sd: StageDir) -> dict[str, Any] | None:
    """A stage's identity: its fingerprint and the content id of its finished data (None
    when it never started)."""
    meta = sd.meta
    if meta is None:
        return None
    return {"fingerprint": meta.fingerprint, "content_id": sd.content_id() if sd.done else None}


def built_from(rd: RunDir) -> dict[str, Any]:
    """What a release is built from: every stage's identity and the pairs kept."""
    pairs = rd.finished("pairs")
    marker = pairs.marker()
    return {
        "stages": {sd.name: stage_identity(sd) for sd in rd.stages()},
        "pairs_finished": marker.time if marker is not None else None,
        "pairs_kept": marker.rows if marker is not None else None,
    }


# ---- what a release records ---------------------------------------------------------------


def recorded_rules(summary: Mapping[str, Any], path: Path) -> tuple[Any, int] | None:
    """The rules a release's pairs were filtered with, as a :class:`pipeline.rules.RuleSet`
    and the word cap; None for a release written before it recorded them. The recorded
    settings are validated as the config's ``pairs`` section is (keys a newer version
    added are left out); a wrong one is one InputError naming release.json."""
    from pydantic import ValidationError

    from pipeline.config import pairs_model

    prov = summary.get("provenance")
    rules = prov.get("rules") if isinstance(prov, Mapping) else None
    if rules is None:
        return None
    where = Path(path) / RELEASE_SUMMARY
    pairs, cap = (rules.get("pairs"), rules.get("word_cap")) if isinstance(rules, dict) else (0, 0)
    if not isinstance(pairs, dict) or isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise InputError(
            "'provenance.rules' must be an object {pairs, word_cap}; publish the release again",
            path=where,
        )
    model = pairs_model()
    known = {k: v for k, v in pairs.items() if k in model.model_fields}
    try:
        return RuleSet(model.model_validate(known), cap), cap
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(str(p) for p in first["loc"])
        raise InputError(
            f"'provenance.rules.pairs.{name}': {first['msg']}; publish the release again "
            "(or pass --config)",
            path=where,
        ) from None
    except (PipelineError, TypeError, ValueError) as exc:
        raise InputError(
            f"'provenance.rules' cannot be used ({exc}); publish the release again", path=where
        ) from None


# ---- is the run still the one the release describes? -------------------------------------


def _served(sd: StageDir) -> dict[str, Any] | None:
    meta = sd.meta
    served = (meta.environment or {}).get("served_by") if meta is not None else None
    return served if isinstance(served, dict) else None


def _state(sd: StageDir) -> str:
    """Where a stage stands now, as the end of a sentence about it."""
    if not sd.path.exists():
        return "was removed"
    if sd.done:
        marker = sd.marker()
        if sd.name == "pairs" and marker is not None:
            return f"is done, keeping {marker.rows} pairs"
        return "is done"
    return "is partly done" if sd.shard_ids() else "has started, nothing done yet"


def _backend_note(sd: StageDir, before: Mapping[str, Any] | None) -> str:
    """ ", now answered by <what>" when the stage's backend is not the one it had."""
    now = _served(sd)
    if now is None or not isinstance(before, Mapping):
        return ""
    if identity_id(now) == identity_id(dict(before)):
        return ""
    return f", now answered by {describe(now)} (was {describe(dict(before))})"


def _moved_on(rd: RunDir) -> tuple[StageDir, str] | None:
    """The first stage (in run order) whose data is no longer what the finished pair stage
    was built from, and how: unfinished, re-done since, or started again with other
    settings. None when the pair stage is not finished (its reader says so)."""
    pairs = rd.stage("pairs")
    marker = pairs.marker() if pairs.done else None
    if marker is None:
        return None
    inputs = marker.inputs or {}
    stages = rd.stages()
    for sd in stages:
        if sd.name == "pairs":
            break
        if sd.meta is None:
            continue
        if not sd.done:
            return sd, f"stage '{sd.name}' is being re-done (it {_state(sd)})"
        if sd.name in inputs and inputs[sd.name] != sd.content_id():
            return sd, f"stage '{sd.name}' was re-done after the pair stage finished"
    for sd in stages:  # each stage's record of the fingerprints it was built on
        meta = sd.meta
        upstream = (meta.settings or {}).get("upstream") if meta is not None else None
        for up, fp in (upstream or {}).items() if isinstance(upstream, dict) else ():
            up_meta = rd.stage(up).meta
            if up_meta is None or up_meta.fingerprint != fp:
                return rd.stage(up), (
                    f"stage '{up}' was started again with other settings after stage "
                    f"'{sd.name}' was built on it"
                )
    return None


def _when(t: Any) -> str:
    if not isinstance(t, int | float):
        return "an earlier run"
    stamp = dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"the pair stage finished {stamp}"


def _release_moved_on(rd: RunDir, summary: Mapping[str, Any]) -> tuple[StageDir, str] | None:
    """How the run differs from what the release recorded at publish time, if it does: the
    first stage (in run order) whose identity changed. A release that recorded nothing
    (written before it did) is compared on the pair stage being unfinished only."""
    recorded = (summary.get("built_from") or {}).get("stages")
    if not isinstance(recorded, dict):
        pairs = rd.stage("pairs")
        if pairs.path.exists() and not pairs.done:
            return pairs, f"the pair stage {_state(pairs)}"
        return None
    for sd in rd.stages():
        want = recorded.get(sd.name)
        if not isinstance(want, dict):
            continue
        now = stage_identity(sd)
        if now == want:
            continue
        if now is None:
            how = "was removed"
        elif now["fingerprint"] != want.get("fingerprint"):
            how = "was re-done with other settings" if sd.done else "is being re-done"
        else:
            how = "was re-done" if sd.done else "is being re-done"
        how = f"stage '{sd.name}' {how} since the release was built"
        pairs = rd.stage("pairs")
        if now is not None:
            how += f" (it {_state(sd)}" + (
                f"; the pair stage {_state(pairs)})" if sd.name != "pairs" else ")"
            )
        return sd, how
    return None


def _keeps_nothing(rd: RunDir) -> bool:
    """Whether the run's finished pair stage kept no pair."""
    sd = rd.stage("pairs")
    try:
        return sd.done and sd.stats().get("kept") == 0
    except PipelineError:
        return False


def check_current(
    source: Path,
    rd: RunDir,
    summary: Mapping[str, Any] | None,
    *,
    stale_ok: bool,
    overridable: bool = True,
) -> str | None:
    """Refuse (one :class:`StaleReleaseError`) a release, or a run's pair stage read in
    place of one, that the run no longer supports; with ``stale_ok`` return that as a note
    instead. ``summary``: the release's release.json (an empty one for a release without
    it; None: reading the pair stage itself). Returns None when the source matches the
    run (or there is nothing in the run to compare with). ``overridable``: False where
    no ``--stale-ok`` exists (publish), and the message does not offer it."""
    if summary is not None:
        found = _release_moved_on(rd, summary) or (
            _moved_on(rd) if rd.stage("pairs").done else None
        )
    else:
        found = _moved_on(rd)
    if found is None:
        return None
    sd, how = found
    prov = (summary or {}).get("provenance")
    served = prov.get("served_by") if isinstance(prov, dict) else None
    how += _backend_note(sd, served.get(sd.name) if isinstance(served, dict) else None)
    if summary is not None:
        built = summary.get("built_from")
        built = built if isinstance(built, dict) else {}
        kept = built.get("pairs_kept", summary.get("rows"))
        when = _when(built.get("pairs_finished"))
        what = f"the release {source} is stale: it was built from {when}"
        what += f" ({kept} pairs)" if kept is not None else ""
        redo = f"run `prb publish {rd.shown}` once the run is done to build it again"
        if _keeps_nothing(rd):
            # publish refuses a run that keeps no pair: pointing there would be a loop
            redo = (
                f"the run's pair stage now keeps no pair, so there is nothing to publish, audit "
                f"or evaluate (`prb inspect {rd.shown}` says why each example was dropped)"
            )
    else:
        what = f"the pair stage of {rd.shown} is stale"
        redo = "finish the run (`prb run CONFIG`) to rebuild it"
    if stale_ok:
        return f"{what}; {how}; read anyway ({STALE_OK})"
    if not overridable:  # publish: a release of pairs the run no longer supports is never made
        raise StaleReleaseError(
            f"{what}, and the run has moved on: {how}. Nothing was published: {redo}, then publish",
            path=source,
        )
    raise StaleReleaseError(
        f"{what}, and the run has moved on: {how}. Nothing was read: {redo}, or pass "
        f"{STALE_OK} to read the old one anyway",
        path=source,
    )
