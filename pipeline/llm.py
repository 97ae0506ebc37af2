"""Runs a stage's LLM requests: cache first, then the backend, with JSON validation,
re-asks, failure accounting and a progress bar.

Answers are committed to the cache the moment they arrive. Requests whose JSON answer
does not validate are re-asked (a new request carrying the bad answer and the error),
up to ``max_reasks`` times, in rounds after the first pass.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError
from tqdm.auto import tqdm

from pipeline.backends.base import Backend, ChatRequest, ChatResult, RequestFailure
from pipeline.cache import RequestCache
from pipeline.errors import BackendError, StageError

# validate(request, text) -> parsed value; raises ValueError with a short reason when invalid.
# It always receives the stage's original request, also when judging the answer to a re-ask.
Validator = Callable[[ChatRequest, str], Any]

REASK_TEMPLATE = (
    "Your previous answer could not be used: {error}. Reply again with only a JSON object "
    "that matches the requested schema, and nothing else."
)


@dataclass
class Answer:
    result: ChatResult
    parsed: list[Any] | None = None  # one per choice when a validator was given
    request: ChatRequest | None = None  # the request finally answered (a re-ask, maybe)
    cached: bool = False
    reasks: int = 0


@dataclass
class Failure:
    reason: str
    attempts: int = 0
    reasks: int = 0


@dataclass
class RunStats:
    requests: int = 0
    cached: int = 0
    sent: int = 0
    failed: int = 0
    reasks: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    failure_reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def json_validator(
    model: type[BaseModel], check: Callable[[ChatRequest, Any], None] | None = None
) -> Validator:
    """A validator that parses an answer into ``model`` and runs ``check`` on the result;
    the error names the first failing field, so a re-ask can tell the model what to fix."""

    def validate(req: ChatRequest, text: str) -> Any:
        try:
            parsed = model.model_validate_json(text)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "answer"
            raise ValueError(f"{where}: {first['msg']}") from None
        if check is not None:
            check(req, parsed)
        return parsed

    return validate


def _reask(req: ChatRequest, bad: str, error: str) -> ChatRequest:
    """The same request with the invalid answer and the reason appended; it keeps ``n``, so
    the answer that finally validates has as many choices as the stage asked for."""
    msgs = (*req.messages, ("assistant", bad), ("user", REASK_TEMPLATE.format(error=error)))
    return ChatRequest(
        messages=msgs,
        model=req.model,
        temperature=req.temperature,
        top_p=req.top_p,
        max_tokens=req.max_tokens,
        n=req.n,
        seed=req.seed,
        json_schema=req.json_schema,
        schema_name=req.schema_name,
    )


def _reason_code(reason: str) -> str:
    return reason.split(":", 1)[0][:60]


class LLMRunner:
    def __init__(
        self,
        backend: Backend,
        cache: RequestCache,
        stage: str,
        *,
        max_reasks: int = 2,
        abort_after_failures: int = 50,
        progress: bool = True,
    ) -> None:
        self.backend = backend
        self.cache = cache
        self.stage = stage
        self.max_reasks = max_reasks
        self.abort_after_failures = abort_after_failures
        self.progress = progress
        self.stats = RunStats()

    def _check(
        self, req: ChatRequest, result: ChatResult, validate: Validator | None
    ) -> tuple[list[Any] | None, str | None, str]:
        """(parsed choices, None, "") when all validate, else (None, error, the bad text)."""
        if validate is None:
            return None, None, ""
        parsed = []
        for choice in result.choices:
            try:
                parsed.append(validate(req, choice.text))
            except ValueError as exc:
                return None, str(exc)[:300], choice.text
        return parsed, None, ""

    def _count_failure(self, code: str) -> None:
        self.stats.failed += 1
        self.stats.failure_reasons[code] = self.stats.failure_reasons.get(code, 0) + 1

    async def stream(
        self, requests: Sequence[ChatRequest], validate: Validator | None = None
    ) -> AsyncIterator[tuple[int, Answer | Failure]]:
        """Yield ``(index, outcome)`` for every request, as each becomes final."""
        start = time.perf_counter()
        st = self.stats
        st.requests += len(requests)
        bar = tqdm(
            total=len(requests),
            desc=self.stage,
            unit="req",
            disable=not self.progress,
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.5,
        )
        # pending: (original index, request to send, re-asks so far)
        pending: list[tuple[int, ChatRequest, int]] = []
        hits = self.cache.get_many(r.key for r in requests)
        retry_round: list[tuple[int, ChatRequest, int]] = []
        for i, req in enumerate(requests):
            hit = hits.get(req.key)
            if hit is None:
                pending.append((i, req, 0))
                continue
            parsed, err, bad = self._check(req, hit, validate)
            if err is None:
                st.cached += 1
                bar.update(1)
                yield i, Answer(hit, parsed, req, cached=True)
            elif self.max_reasks > 0:
                retry_round.append((i, _reask(req, bad, err), 1))
            else:
                self._count_failure("invalid_json")
                bar.update(1)
                yield i, Failure(f"invalid_json: {err}")

        # Re-asks already cached from an earlier run resolve without the backend.
        while retry_round:
            next_round = []
            r_hits = self.cache.get_many(r.key for _, r, _ in retry_round)
            for i, req, k in retry_round:
                hit = r_hits.get(req.key)
                if hit is None:
                    pending.append((i, req, k))
                    continue
                parsed, err, bad = self._check(requests[i], hit, validate)
                if err is None:
                    st.cached += 1
                    bar.update(1)
                    yield i, Answer(hit, parsed, req, cached=True, reasks=k)
                elif k < self.max_reasks:
                    next_round.append((i, _reask(req, bad, err), k + 1))
                else:
                    self._count_failure("invalid_json")
                    bar.update(1)
                    yield i, Failure(f"invalid_json: {err} (after {k} re-asks)", reasks=k)
            retry_round = next_round

        missing = getattr(self.backend, "missing", None)
        if pending and missing is not None:
            n_missing = missing([r for _, r, _ in pending])
            if n_missing:
                bar.close()
                raise BackendError(
                    f"replay: {n_missing} of {len(requests)} requests of stage '{self.stage}' "
                    "are not in the request cache; run this stage with a live backend first"
                )

        consecutive = 0
        while pending:
            batch, pending = pending, []
            async for j, res in self.backend.run([r for _, r, _ in batch]):
                i, req, k = batch[j]
                if isinstance(res, RequestFailure):
                    consecutive += 1
                    self._count_failure(_reason_code(res.reason))
                    self.cache.put_error(req, self.stage, res.reason, res.attempts)
                    bar.update(1)
                    bar.set_postfix(failed=st.failed, tokens=st.completion_tokens, refresh=False)
                    yield i, Failure(res.reason, res.attempts, k)
                    if consecutive >= self.abort_after_failures:
                        bar.close()
                        raise StageError(
                            f"stage '{self.stage}': {consecutive} requests in a row failed; "
                            f"the server looks down. Last error: {res.reason}"
                        )
                    continue
                consecutive = 0
                st.sent += 1
                st.prompt_tokens += res.prompt_tokens
                st.completion_tokens += res.completion_tokens
                self.cache.put(req, res, self.stage)
                parsed, err, bad = self._check(requests[i], res, validate)
                if err is not None and k < self.max_reasks:
                    st.reasks += 1
                    pending.append((i, _reask(req, bad, err), k + 1))
                    continue
                bar.update(1)
                bar.set_postfix(failed=st.failed, tokens=st.completion_tokens, refresh=False)
                if err is not None:
                    self._count_failure("invalid_json")
                    yield i, Failure(f"invalid_json: {err} (after {k} re-asks)", reasks=k)
                else:
                    yield i, Answer(res, parsed, req, cached=False, reasks=k)
        bar.close()
        st.seconds += time.perf_counter() - start
