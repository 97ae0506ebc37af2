"""responses: n chosen candidates per example and n rejected ones per strategy.

Strategies for the rejected side:
- ``avoid_all``: a good answer that avoids every expected aspect (the reference method);
- ``violate_one``: covers every aspect but one targeted aspect (harder pairs);
- ``other_user``: follows the rubric of another user who asked a similar question.

All of a stage's requests go to the backend at once, so the server sees a full queue
to the end; an example's rows are written as soon as its last request is answered.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rapidfuzz import fuzz, process
from rapidfuzz.utils import default_process

from pipeline.config.sections import PROMPT_FILE_OPTIONAL, PROMPT_FILE_USES
from pipeline.core.fields import count_words
from pipeline.core.ids import content_hash, stable_id
from pipeline.engine.llm import Answer, Failure, Job, text_retry
from pipeline.rules.text import unfinished
from pipeline.run import StageDir
from pipeline.stages.base import Context, Placeholders, PlannedExample, Stage
from pipeline.stages.scaffold import ExampleLoop, OpenExample
from pipeline.types.chat import ChatRequest, ChatResult, Choice
from pipeline.types.promptfiles import PromptFile, read_prompt_files
from pipeline.types.prompts import PromptTemplate, load_template
from pipeline.types.records import ranked_posts

if TYPE_CHECKING:
    import numpy as np

TEMPLATES = {
    "chosen": "response_chosen",
    "avoid_all": "response_avoid_all",
    "violate_one": "response_violate_one",
    "other_user": "response_other_user",
}
CANDIDATE_FIELDS = frozenset(
    {
        "candidate_id",
        "example_id",
        "user_id",
        "rubric_version",
        "side",
        "strategy",
        "sample_index",
        "text",
        "finish_reason",
        "word_count",
        "honours",
        "violates",
    }
)


@dataclass(frozen=True)
class FilePrompt:
    """A response prompt from the user's file (``prompts.dir`` / ``prompts.files``), in the
    reference's style: one user turn, the file's text with ``{question}``, ``{profile}``
    (the ranked posts, ``Post i (Category: c):`` then the text, one after another),
    ``{plan}`` (the prompt's rubric aspects joined by ", ") and optionally ``{word_cap}``."""

    file: PromptFile

    @property
    def sha256(self) -> str:
        return self.file.sha256

    def provenance(self) -> dict[str, str]:
        return self.file.provenance()

    def render(self, **variables: Any) -> tuple[tuple[str, str], ...]:
        """The one user turn, from the variables the project's templates get (``question``,
        ``profile``: the ranked posts, ``items``: the prompt's rubric items, ``word_cap``)."""
        values = {
            "question": variables["question"],
            "profile": profile_text(variables["profile"]),
            "plan": ", ".join(it["aspect"] for it in variables["items"]),
            "word_cap": str(variables["word_cap"]),
        }
        return (("user", self.file.fill(values)),)


def profile_text(posts: Sequence[Mapping[str, Any]]) -> str:
    """The posts as a reference-style prompt file gets them in ``{profile}``: numbered from
    1, each with its category where the post has one."""
    lines = []
    for i, post in enumerate(posts, 1):
        cat = post.get("category")
        head = f"Post {i} (Category: {cat}):" if cat not in (None, "") else f"Post {i}:"
        lines.append(f"{head}\n{post.get('text') or ''}")
    return "\n".join(lines)


def response_prompts(cfg: Any, names: Sequence[str]) -> dict[str, PromptTemplate | FilePrompt]:
    """The prompt of each response kind (``chosen`` and the strategies): the user's file
    where ``prompts.files`` names one, else the project's template."""
    p = cfg.prompts
    files = read_prompt_files(
        cfg.resolve_input(p.dir), p.files, PROMPT_FILE_USES, PROMPT_FILE_OPTIONAL
    )
    return {n: FilePrompt(files[n]) if n in files else load_template(TEMPLATES[n]) for n in names}


def derive_seed(*parts: Any) -> int:
    """A per-request seed from the run seed and the request's identity (fits in int32)."""
    return int(stable_id(*parts, length=8), 16) % (2**31 - 1)


# Below this many examples the donor search compares every question with every other
# (the exact answer, and cheap); above it, candidates come from an inverted index.
DONOR_BRUTE_LIMIT = 2000
# Candidates per question taken from the inverted index, rarest shared words first.
DONOR_CANDIDATES = 256


@dataclass(frozen=True)
class DonorEntry:
    example_id: str
    user_id: str
    category: str
    question: str


def _rubric_fields(r: Mapping[str, Any]) -> dict[str, Any]:
    """What the responses stage keeps of a rubric row: its version, user and items (id and
    aspect)."""
    return {
        "rubric_version": r["rubric_version"],
        "user_id": r["user_id"],
        "items": [{"item_id": it["item_id"], "aspect": it["aspect"]} for it in r["items"]],
    }


def find_donors(
    pool: Sequence[DonorEntry],
    *,
    brute_limit: int = DONOR_BRUTE_LIMIT,
    candidates: int = DONOR_CANDIDATES,
) -> dict[str, str | None]:
    """For each example, the example of a *different* user with the most similar question.

    Score: rapidfuzz token_set_ratio of the questions, plus 10 for the same category; ties
    go to the smaller id, so the choice is deterministic. Comparing every question with
    every other is quadratic (10^10 comparisons at 100,000 examples), so above
    ``brute_limit`` each question is scored only against ``candidates`` examples that share
    its rarest words (an inverted index): a similar question shares words, and rare words
    say more than common ones. A word on more than ``4 * candidates`` examples is common:
    once another user's example is in hand the search stops there; before (the rarer words
    were the question's own, a number or a name), the examples that share the common word
    are narrowed by the question's next words, and those sharing the most are scored
    (:func:`_narrow`): at most ``candidates`` of them, where taking the common word's
    first ``4 * candidates`` examples made each question of a large set cost four times
    what it costs in a small one. ``tests/test_units.py`` holds the donors so found to
    score as high as comparing every pair on 1,500 made-up questions, and within the
    same-category bonus when every question has a number of its own.
    """
    import numpy as np

    pool = sorted(pool, key=lambda e: e.example_id)
    n = len(pool)
    if n == 0:
        return {}
    questions = [e.question for e in pool]
    users = np.array([e.user_id for e in pool], dtype=object)
    cats = np.array([e.category for e in pool], dtype=object)
    donors: dict[str, str | None] = {}

    def pick(i: int, cand: np.ndarray) -> None:
        ex = pool[i]
        cand = cand[users[cand] != ex.user_id]
        if len(cand) == 0:
            donors[ex.example_id] = None
            return
        scores = process.cdist([ex.question], [questions[j] for j in cand],
                               scorer=fuzz.token_set_ratio, workers=1)[0]  # fmt: skip
        scores = scores.astype(np.float32) + np.where(cats[cand] == ex.category, 10.0, 0.0)
        # cand is sorted, so argmax (the first maximum) breaks ties by the smallest id
        donors[ex.example_id] = pool[int(cand[int(np.argmax(scores))])].example_id

    if n <= brute_limit:
        everyone = np.arange(n)
        for i in range(n):
            pick(i, everyone)
        return donors

    tokens = [sorted(set(default_process(q).split())) for q in questions]
    postings: dict[str, list[int]] = {}
    for i, toks in enumerate(tokens):
        for t in toks:
            postings.setdefault(t, []).append(i)
    cap = 4 * candidates  # a word this common says little; never score its whole list
    arrays: dict[str, np.ndarray] = {}

    def array(t: str) -> np.ndarray:
        """A common word's list as an array (ascending: examples were added in order)."""
        if t not in arrays:
            arrays[t] = np.asarray(postings[t], dtype=np.int64)
        return arrays[t]

    for i, toks in enumerate(tokens):
        uid = pool[i].user_id
        chosen: set[int] = set()
        order = sorted(toks, key=lambda t: len(postings[t]))
        for k, t in enumerate(order):
            plist = postings[t]
            if len(plist) > cap:
                # A common word. With another user's example in hand, stop. Without one (the
                # rarer words were this question's own: a number, a name), take the examples
                # that share this word and as many of the next ones as still leave another
                # user's example: the questions most like this one, whatever the set's size.
                if not any(users[j] != uid for j in chosen):
                    near = _narrow(
                        array(t), [array(w) for w in order[k + 1 :]], users, uid, candidates
                    )
                    chosen.update(near)
                break
            chosen.update(plist)
            if len(chosen) >= candidates:
                break
        chosen.discard(i)
        pick(i, np.array(sorted(chosen), dtype=np.int64))
    return donors


def _narrow(
    found: np.ndarray, others: Sequence[np.ndarray], users: Any, user_id: str, keep: int
) -> list[int]:
    """Up to ``keep`` examples of users other than ``user_id`` from ``found`` (ascending
    example indices), those that share the most of ``others`` first: ``found`` is narrowed
    to the examples also in each of ``others`` in turn (a word that would leave no other
    user's example is skipped), and the narrowest level is taken first, then the wider ones
    until ``keep``. Every list is ascending, so membership is a binary search: the cost is
    that of the lists, never of the set."""
    import numpy as np

    levels = [found[users[found] != user_id]]
    for other in others:
        at = np.minimum(np.searchsorted(other, found), other.size - 1)
        both = found[other[at] == found]
        mine = both[users[both] != user_id]
        if mine.size:
            found = both
            levels.append(mine)
    picked: dict[int, None] = {}
    for level in reversed(levels):
        # at most len(picked) of a level's first `keep` are taken already: enough are new
        for j in level[:keep].tolist():
            if len(picked) == keep:
                return list(picked)
            picked.setdefault(j, None)
    return list(picked)


@dataclass
class _Job:
    strategy: str
    sample_offset: int  # sample index of the first choice of this request
    template: PromptTemplate | FilePrompt
    honours: list[str]
    violates: list[str]
    extra: dict[str, Any]


def _retry_of(req: ChatRequest, result: ChatResult) -> ChatRequest | None:
    """The retry the runner sends for a free-text answer that is not finished, if any."""
    if any(unfinished(c.text, c.finish_reason) for c in result.choices):
        return text_retry(req)
    return None


def _reasoning_record(choice: Choice) -> dict[str, Any]:
    """What a candidate's provenance records of its answer's reasoning (nothing when the
    answer came with none): its tokens, characters, and whether it used its whole budget."""
    if choice.reasoning is None:
        return {}
    return {
        "reasoning": {
            "tokens": choice.reasoning_tokens,
            "chars": len(choice.reasoning),
            "cut": choice.reasoning_cut,
        }
    }


@dataclass
class _Example:
    """What an example in flight keeps: its rubric, its jobs and the rows so far."""

    user_id: str
    rubric: dict[str, Any]
    jobs: list[_Job]
    requests: list[ChatRequest]
    rows: list[dict] = field(default_factory=list)


class ResponseStage(Stage):
    name = "responses"
    reads = {
        "ingest": frozenset(
            {"example_id", "user_id", "question", "category", "profile", "profile_view"}
        ),
        "rubrics": frozenset({"example_id", "user_id", "rubric_version", "items"}),
    }
    writes = CANDIDATE_FIELDS | {"provenance"}

    def uses_llm(self, ctx: Context) -> bool:
        return True

    def settings(self, ctx: Context) -> dict[str, Any]:
        c = ctx.config
        names = ["chosen", *c.responses.strategies]
        return {
            "responses": c.responses.model_dump(mode="json"),
            "model": c.backend.model,
            "served_by": ctx.served_by_setting(),
            "seed": c.run.seed,
            "templates": {n: t.sha256 for n, t in response_prompts(c, names).items()},
        }

    def expected(self, ctx: Context) -> int:
        return self.input_count(ctx, "rubrics")  # one row per example

    def run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        return asyncio.run(self._run(ctx, out))

    @staticmethod
    def load_rubrics(ctx: Context, stage: Stage) -> Mapping[str, dict[str, Any]]:
        """example_id -> the rubric fields prompts and rows need (items: id and aspect).
        From a finished rubrics stage they are read as asked, through an index of where
        each sits in the shards, never held all at once; only the rows a plan makes up
        (``prb plan`` before the rubrics stage ran) are gathered in a dict."""
        return stage.input_fields(ctx, "rubrics", _rubric_fields)

    def donors(self, ctx: Context, rubrics: Mapping[str, dict]) -> dict[str, str | None]:
        if "other_user" not in ctx.config.responses.strategies:
            return {}
        pool = sorted(
            (
                DonorEntry(e["example_id"], e["user_id"], str(e.get("category")), e["question"])
                for e in self.input_rows(ctx, "ingest")
                if e["example_id"] in rubrics
            ),
            key=lambda e: e.example_id,
        )
        # the search is deterministic: a re-run of this stage reuses its result
        key = content_hash(
            {"kind": "donors", "version": 3, "brute_limit": DONOR_BRUTE_LIMIT,
             "candidates": DONOR_CANDIDATES, "pool": [list(e.__dict__.values()) for e in pool]}
        )  # fmt: skip
        donors = ctx.cache.get_derived(key)
        if donors is None:
            donors = find_donors(pool)
            if not ctx.cache.readonly:  # `prb plan` reads the cache, never writes it
                ctx.cache.put_derived(key, "donors", donors)
        return donors

    def example_jobs(
        self,
        ctx: Context,
        ex: dict,
        rubrics: Mapping[str, dict],
        donors: dict[str, str | None],
        skipped: Counter,
    ) -> tuple[list[_Job], list[ChatRequest]]:
        """Every request of one example; its profile is ranked once for all of them."""
        c = ctx.config
        r = c.responses
        samp = r.sampling
        rub = rubrics[ex["example_id"]]
        items = rub["items"]
        ids = [it["item_id"] for it in items]
        common = {"question": ex["question"], "profile": ranked_posts(ex), "word_cap": r.word_cap}
        jobs: list[_Job] = []
        requests: list[ChatRequest] = []

        def add(job: _Job, msgs: tuple, n: int) -> None:
            seed = derive_seed(c.run.seed, ex["example_id"], job.strategy, job.sample_offset)
            jobs.append(job)
            requests.append(
                ChatRequest.sampled(
                    msgs, c.backend.model, samp, n=n, seed=seed, served_by=ctx.served_by_id
                )
            )

        prompts = response_prompts(c, ["chosen", *r.strategies])
        t = prompts["chosen"]
        add(_Job("chosen", 0, t, ids, [], {}), t.render(items=items, **common), r.n)
        for strategy in r.strategies:
            t = prompts[strategy]
            if strategy == "avoid_all":
                add(_Job(strategy, 0, t, [], ids, {}), t.render(items=items, **common), r.n)
            elif strategy == "violate_one":
                if len(items) < 2:
                    skipped["violate_one_single_item_rubric"] += 1
                    continue
                # rotate the target so the n samples spread over different items
                start = int(stable_id(ex["example_id"], "target", length=8), 16)
                for j in range(r.n):
                    target = items[(start + j) % len(items)]
                    keep = [it for it in items if it["item_id"] != target["item_id"]]
                    job = _Job(
                        strategy,
                        j,
                        t,
                        [it["item_id"] for it in keep],
                        [target["item_id"]],
                        {"target_item": target["item_id"]},
                    )
                    add(job, t.render(keep=keep, target=target, **common), 1)
            elif strategy == "other_user":
                donor_id = donors.get(ex["example_id"])
                if donor_id is None:
                    skipped["other_user_no_donor"] += 1
                    continue
                donor = rubrics[donor_id]
                extra = {
                    "other_user": {
                        "user_id": donor["user_id"],
                        "example_id": donor_id,
                        "rubric_version": donor["rubric_version"],
                        "item_ids": [it["item_id"] for it in donor["items"]],
                    }
                }
                msgs = t.render(other_items=donor["items"], **common)
                add(_Job(strategy, 0, t, [], ids, extra), msgs, r.n)
        return jobs, requests

    def _rows(self, ctx: Context, example_id: str, ex: _Example, k: int, ans: Answer) -> list[dict]:
        c = ctx.config
        job, req, rub = ex.jobs[k], ex.requests[k], ex.rubric
        rows = []
        for j, choice in enumerate(ans.result.choices):
            sample = job.sample_offset + j
            side = "chosen" if job.strategy == "chosen" else "rejected"
            rows.append(
                {
                    "candidate_id": stable_id(
                        example_id,
                        rub["rubric_version"],
                        job.strategy,
                        job.extra.get("target_item"),
                        sample,
                    ),
                    "example_id": example_id,
                    "user_id": ex.user_id,
                    "rubric_version": rub["rubric_version"],
                    "side": side,
                    "strategy": job.strategy,
                    "sample_index": sample,
                    "text": choice.text,
                    "finish_reason": choice.finish_reason,
                    "word_count": count_words(choice.text),
                    "honours": job.honours,
                    "violates": job.violates,
                    **job.extra,
                    "provenance": {
                        **job.template.provenance(),
                        "model": ans.result.model or c.backend.model,
                        "served_by": ctx.served_by,
                        "sampling": c.responses.sampling.model_dump(),
                        "seed": req.seed,
                        "n": req.n,
                        # the request finally answered: a cut-off answer's retry has more
                        # max_tokens (pipeline/engine/llm.py TEXT_REASKS)
                        "request_key": ans.request.key,
                        "max_tokens": ans.request.max_tokens,
                        "reasks": ans.reasks,
                        # usage is per request; a request with n choices shares it
                        "usage": {
                            "prompt_tokens": ans.result.prompt_tokens,
                            "completion_tokens": ans.result.completion_tokens,
                        },
                        # a reasoning model's reasoning, taken out of the text: its length
                        # only (pipeline/backends/reasoning.py)
                        **_reasoning_record(choice),
                    },
                }
            )
        return rows

    def _open_examples(
        self,
        ctx: Context,
        done: AbstractSet[str],
        rubrics: Mapping[str, dict[str, Any]],
        donors: dict[str, str | None],
        skipped: Counter,
    ) -> Iterator[tuple[str, _Example]]:
        """Each example still to do, with its requests (``example_jobs``): what ``_run``
        sends and what ``plan_examples`` plans, from one walk over the ingest shards."""
        for ex in self.input_rows(ctx, "ingest"):
            ex_id = ex["example_id"]
            if ex_id not in rubrics or ex_id in done:
                continue
            ex_jobs, requests = self.example_jobs(ctx, ex, rubrics, donors, skipped)
            yield ex_id, _Example(ex["user_id"], rubrics[ex_id], ex_jobs, requests)

    async def _run(self, ctx: Context, out: StageDir) -> dict[str, Any]:
        c = ctx.config
        done = out.done_examples()
        rubrics = self.load_rubrics(ctx, self)
        donors = self.donors(ctx, rubrics)
        skipped: Counter = Counter()
        per_example = 1 + sum(c.responses.n if s == "violate_one" else 1
                              for s in c.responses.strategies)  # fmt: skip
        todo = len(rubrics) - len(done & rubrics.keys())
        loop = ExampleLoop(out, self.shard_size(ctx))

        def jobs() -> Iterator[Job]:
            # examples stream from the ingest shards; only those in flight are held
            for ex_id, state in self._open_examples(ctx, done, rubrics, donors, skipped):
                jobs_ = [Job(req, k) for k, req in enumerate(state.requests)]
                yield from loop.start(ex_id, jobs_, state)

        def on_outcome(st: OpenExample, k: int, outcome: Answer | Failure) -> list[Job]:
            ex: _Example = st.state
            if isinstance(outcome, Failure):
                # a free-text request fails only in transport (or the replay cache lacks
                # it): the example is retried whole on the next run
                st.pending = True
            else:
                ex.rows.extend(self._rows(ctx, st.example_id, ex, k, outcome))
            return []

        def on_complete(st: OpenExample) -> tuple[list[dict], list[dict]]:
            rows = st.state.rows
            return sorted(rows, key=lambda r: (r["strategy"], r["sample_index"])), []

        async with ctx.llm(self.name) as runner:
            await loop.drive(runner, jobs(), on_outcome, on_complete, total=todo * per_example)
            llm_stats = runner.stats.as_dict()
        return self._stats(out, llm_stats, len(done), loop.pending, skipped)

    # ---- prb plan (pipeline/plan/) ------------------------------------------------------
    def plan_examples(
        self, ctx: Context, done: AbstractSet[str], placeholders: Placeholders
    ) -> Iterator[PlannedExample]:
        """The requests ``run`` sends for each example (``example_jobs``) and the candidate
        rows it would write (``_rows``): from the cached answer where the cache has one, else
        from a placeholder answer of the expected length."""
        rubrics = self.load_rubrics(ctx, self)
        donors = self.donors(ctx, rubrics)
        skipped: Counter = Counter()
        for ex_id, state in self._open_examples(ctx, done, rubrics, donors, skipped):
            requests = state.requests
            hits = ctx.cache.get_many(r.key for r in requests)
            guessed = False
            planned = list(requests)
            for k, req in enumerate(requests):
                result = hits.get(req.key)
                answered = req
                if result is None or len(result.choices) != req.n:
                    text, guessed = placeholders.answer(), True
                    result = ChatResult([Choice(text, "stop") for _ in range(req.n)])
                elif (retry := _retry_of(req, result)) is not None:
                    # a cached answer that is not finished is asked again once (llm.py)
                    again = ctx.cache.get(retry.key)
                    if again is None:
                        planned.append(retry)
                    else:
                        result, answered = again, retry
                answer = Answer(result, [], answered)
                state.rows.extend(self._rows(ctx, ex_id, state, k, answer))
            rows = sorted(state.rows, key=lambda r: (r["strategy"], r["sample_index"]))
            yield PlannedExample(ex_id, planned, rows, placeholders=guessed)

    def _stats(
        self, out: StageDir, llm: dict, resumed: int, pending: int, skipped: Counter
    ) -> dict[str, Any]:
        per_strategy: Counter = Counter()
        finish: Counter = Counter()
        examples = set()
        for r in out.rows():
            per_strategy[r["strategy"]] += 1
            finish[r["finish_reason"]] += 1
            examples.add(r["example_id"])
        return {
            "examples": len(examples),
            "candidates": sum(per_strategy.values()),
            "per_strategy": dict(per_strategy),
            "finish_reasons": dict(finish),
            "skipped": dict(skipped),
            "resumed_examples": resumed,
            "pending_examples": pending,
            "llm": llm,
        }
