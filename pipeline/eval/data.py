"""What a scorer sees: building its inputs from pairs rows, one setting at a time.

Inputs are built from an allowlist, never by removing columns: the question, the text of
the user's profile posts (profile setting), the two answers, and the rubric aspects only in
the labelled rubric-aware control. ``rubric_aspects`` (outside the control), ``narrative``,
and every provenance, judge and human column therefore cannot reach a scorer, whatever a
release adds later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.ids import content_hash
from pipeline.types.profile import select_profile
from pipeline.types.prompts import load_template

POINTWISE_TEMPLATE = "eval_pointwise"
PAIRWISE_TEMPLATE = "eval_pairwise"


@dataclass(frozen=True)
class Setting:
    name: str
    role: str  # "score": a scorer's result; "control": a validity check, never a score
    label: str


SETTINGS: dict[str, Setting] = {
    "question": Setting("question", "score", "question only (the reference protocol)"),
    "profile": Setting("profile", "score", "question with the user's top-k profile posts"),
    "rubric": Setting(
        "rubric",
        "control",
        "rubric-aware control: the scorer sees the rubric aspects; a validity check of the "
        "split, not a model's score",
    ),
}
DEFAULT_SETTINGS = ("question", "profile")
# Row columns the per-group figures are split by, when the split has them.
GROUP_COLUMNS = {"category": "category", "strategy": "strategy", "human_verdict": "human_verdict"}


@dataclass(frozen=True)
class EvalPair:
    """One pair, reduced to what scorers may see plus the columns figures are grouped by."""

    key: str
    question: str
    chosen: str
    rejected: str
    posts: tuple[str, ...]  # the selected profile posts' text, most relevant first
    aspects: tuple[str, ...]  # rubric aspects: only the rubric-aware control shows them
    groups: dict[str, str]
    has_profile: bool
    has_rubric: bool


def _text_list(value: Any, key: str, where: str, row: int) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
        raise InputError(f"row {row}: '{key}' must be a list of objects", path=where, field=key)
    return value


def _pair_key(row: dict[str, Any], index: int) -> str:
    for col in ("pair_id", "id", "example_id"):
        if isinstance(row.get(col), str) and row[col]:
            return row[col]
    return f"row-{index}"


def _recorded_posts(row: dict[str, Any], profile: list[dict[str, Any]]) -> list[dict] | None:
    """The posts the run's own ranking put first (a release row's ``profile_view``: indices
    into ``profile``, most relevant first), with text; None when the row records none."""
    view = row.get("profile_view")
    order = view.get("order") if isinstance(view, dict) else None
    if not isinstance(order, list):
        return None
    picked = [profile[i] for i in order if isinstance(i, int) and 0 <= i < len(profile)]
    return [p for p in picked if isinstance(p.get("text"), str) and p["text"].strip()]


def build_pairs(
    rows: Sequence[dict[str, Any]],
    source: str,
    *,
    top_k: int = 10,
    ranker: str = "bm25",
    embedding_model: str = "",
) -> list[EvalPair]:
    """Check the rows and reduce each to an EvalPair. The profile posts are those the run
    showed (the row's recorded ``profile_view``) where the row records them; otherwise the
    top-k are selected exactly as the generation stages do
    (``pipeline.types.profile.select_profile``) with the given ranker."""
    pairs = []
    seen: set[str] = set()
    for i, r in enumerate(rows):
        for col in ("question", "chosen", "rejected"):
            if not isinstance(r.get(col), str):
                raise InputError(
                    f"row {i}: '{col}' must be a string, got {type(r.get(col)).__name__}",
                    path=source,
                    field=col,
                )
        profile = _text_list(r.get("profile"), "profile", source, i)
        aspects = _text_list(r.get("rubric_aspects"), "rubric_aspects", source, i)
        posts = [p for p in profile if isinstance(p.get("text"), str) and p["text"].strip()]
        chosen_posts = _recorded_posts(r, profile)
        if chosen_posts is None:
            chosen_posts = select_profile(r["question"], posts, top_k, ranker, embedding_model)
        key = _pair_key(r, i)
        if key in seen:  # a split with repeated ids still gets one key per row
            key = f"{key}#{i}"
        seen.add(key)
        groups = {}
        for name, col in GROUP_COLUMNS.items():
            if col in r:
                value = r.get(col)
                groups[name] = "not annotated" if value is None else str(value)
        pairs.append(
            EvalPair(
                key=key,
                question=r["question"],
                chosen=r["chosen"],
                rejected=r["rejected"],
                posts=tuple(p["text"] for p in chosen_posts),
                aspects=tuple(a["aspect"] for a in aspects if isinstance(a.get("aspect"), str)),
                groups=groups,
                has_profile=bool(posts),
                has_rubric=any(isinstance(a.get("aspect"), str) for a in aspects),
            )
        )
    if not pairs:
        raise InputError("no pairs to evaluate", path=source)
    return pairs


def profile_selection(rows: Sequence[dict[str, Any]], cfg: Any) -> dict[str, Any]:
    """How the split's profile posts were chosen, for the results: the run's recorded
    ranking where every row carries one (``from`` says so), else the config's ranker."""
    views = [r.get("profile_view") for r in rows]
    if views and all(isinstance(v, dict) and isinstance(v.get("order"), list) for v in views):
        rankers = sorted({str(v.get("ranker")) for v in views if isinstance(v, dict)})
        top_ks = sorted({v.get("top_k") for v in views if isinstance(v, dict)}, key=str)
        return {
            "ranker": rankers[0] if len(rankers) == 1 else rankers,
            "top_k": top_ks[0] if len(top_ks) == 1 else top_ks,
            "from": "the split's recorded ranking (profile_view)",
        }
    p = cfg.profile
    out: dict[str, Any] = {"top_k": p.top_k, "ranker": p.ranker}
    if any(isinstance(v, dict) for v in views):
        out["from"] = "the config for rows without a recorded ranking; the others use theirs"
    return out


def load_split(
    path: str | Path, cfg: Any, limit: int | None = None, *, stale_ok: bool = False
) -> tuple[list[EvalPair], dict[str, Any]]:
    """The split at ``path`` (a release, a run directory, a pairs file: whatever ``prb
    audit`` reads, refused the same way when its run has moved on) as EvalPairs, and its
    description for the results."""
    pairs, split, _ = load_split_rows(path, cfg, limit, stale_ok=stale_ok)
    return pairs, split


def load_split_rows(
    path: str | Path, cfg: Any, limit: int | None = None, *, stale_ok: bool = False
) -> tuple[list[EvalPair], dict[str, Any], list[dict[str, Any]]]:
    """``load_split``, and the rows the pairs were built from (in the same order)."""
    from pipeline.audit import load_pairs
    from pipeline.audit.load import check_types

    path = Path(path)
    # a run's pairs come as full records (profile and rubric included), like a release's
    rows, source = load_pairs(path, stale_ok=stale_ok)
    if limit:
        rows = rows[:limit]
    # the release table's types (pipeline/release): a bad field (a recorded ranking that
    # points past the profile) is one error naming the file, line and field
    check_types(rows, source)
    p = cfg.profile
    pairs = build_pairs(
        rows,
        source.get("path", str(path)),
        top_k=p.top_k,
        ranker=p.ranker,
        embedding_model=p.model,  # the chosen ranker's model (contriever's or embedding's)
    )
    public = {k: v for k, v in source.items() if not k.startswith("_")}
    split = {
        **public,
        "rows": len(pairs),
        "fingerprint": fingerprint(pairs),
        "limit": limit,
        "profile_selection": profile_selection(rows, cfg),
    }
    return pairs, split, rows


def context(pair: EvalPair, setting: str) -> dict[str, Any]:
    """The template variables a setting shows besides the answers."""
    return {
        "question": pair.question,
        "posts": list(pair.posts) if setting == "profile" else [],
        "aspects": list(pair.aspects) if setting == "rubric" else [],
    }


def user_turn(pair: EvalPair, setting: str) -> str:
    """The user message a pointwise reward model sees before the answer."""
    ((_, text),) = load_template(POINTWISE_TEMPLATE).render(**context(pair, setting))
    return text


def pairwise_messages(
    pair: EvalPair, setting: str, order: str, *, fmt: str, ties: bool
) -> tuple[tuple[str, str], ...]:
    """Judge messages for one A/B order: "AB" puts the chosen answer first."""
    a, b = (pair.chosen, pair.rejected) if order == "AB" else (pair.rejected, pair.chosen)
    return load_template(PAIRWISE_TEMPLATE).render(
        **context(pair, setting), answer_a=a, answer_b=b, format=fmt, ties=ties
    )


def listed(items: Sequence[str]) -> str:
    """Profile posts or rubric aspects as a prompt file's ``{profile}`` / ``{rubric}``
    shows them: one per line, each after "- ", in their order (as the project's own
    template lists them)."""
    return "\n".join(f"- {x}" for x in items)


def file_messages(
    pair: EvalPair, setting: str, order: str, *, system: Any, user: Any
) -> tuple[tuple[str, str], ...]:
    """Judge messages from the user's prompt files (``pipeline.types.promptfiles.PromptFile``)
    for one A/B order: the system file's text as written, then the user file with the
    question and the two answers filled in, as the reference's pairwise script sends them.
    ``{profile}`` / ``{rubric}`` (where the file has them) hold the setting's posts or
    aspects, and are empty in the other settings."""
    a, b = (pair.chosen, pair.rejected) if order == "AB" else (pair.rejected, pair.chosen)
    ctx = context(pair, setting)
    values = {
        "question": pair.question,
        "Response_A": a,
        "Response_B": b,
        "profile": listed(ctx["posts"]),
        "rubric": listed(ctx["aspects"]),
    }
    return (("system", system.text), ("user", user.fill(values)))


def usable_settings(pairs: list[EvalPair], wanted: Sequence[str]) -> tuple[list[str], dict]:
    """The settings that can run on these pairs, and a reason for each one skipped."""
    skipped = {}
    keep = []
    for s in wanted:
        if s == "profile" and not any(p.has_profile for p in pairs):
            skipped[s] = "no pair has profile posts"
        elif s == "rubric" and not any(p.has_rubric for p in pairs):
            skipped[s] = "no pair has rubric_aspects"
        else:
            keep.append(s)
    return keep, skipped


def fingerprint(pairs: list[EvalPair]) -> str:
    """A hash of everything scorers were shown, so a leaderboard row names its split."""
    return content_hash(
        [[p.key, p.question, p.chosen, p.rejected, p.posts, p.aspects] for p in pairs], 16
    )
