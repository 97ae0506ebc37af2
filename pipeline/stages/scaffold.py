"""The loop every LLM stage shares: open an example, track its requests, finish it, write
shards as examples finish, and keep what finished when the stage stops early.

A stage supplies what is its own: the jobs of an example (:meth:`ExampleLoop.start`),
what one answer means (``on_outcome``, which may ask follow-up questions) and the rows an
example gives once its last answer is in (``on_complete``). The loop does the rest the
same way for rubrics, responses and the judge:

- an example whose request failed for now (a transient failure, retried on the next run)
  is *pending*: nothing of it is written, and the stage is left unfinished;
- a finished example's rows (and rejects) are buffered and written a shard per
  ``chunk`` examples; ``flush`` runs in ``finally``, so whatever finished is kept when the
  stage stops on an error, an interrupt or a budget;
- the runner's statistics are returned with the number of pending examples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.engine.llm import Answer, Failure, Job, LLMRunner
from pipeline.run import StageDir

# on_outcome(example, key, outcome) -> follow-up jobs (tagged by key) for the same example
OnOutcome = Callable[["OpenExample", Any, "Answer | Failure"], Iterable[Job]]
# on_complete(example) -> (rows, rejects) for an example whose last answer is in
OnComplete = Callable[["OpenExample"], tuple[list[dict], list[dict]]]


@dataclass
class OpenExample:
    """An example with requests in flight. ``state`` is the stage's own."""

    example_id: str
    state: Any = None
    outstanding: int = 0
    pending: bool = False  # a request failed for now: retried on the next run
    failed: bool = False  # a request failed for good: the stage records it
    requests: int = 0  # jobs of this example so far, follow-ups included
    reasks: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class ExampleLoop:
    def __init__(
        self, out: StageDir, chunk: int, after_flush: Callable[[], None] | None = None
    ) -> None:
        self.out = out
        self.chunk = chunk
        self.after_flush = after_flush
        self.open: dict[str, OpenExample] = {}
        self.pending = 0
        self._rows: list[dict] = []
        self._rejects: list[dict] = []
        self._examples = 0

    # ---- examples -----------------------------------------------------------------------
    def start(self, example_id: str, jobs: list[Job], state: Any = None) -> Iterator[Job]:
        """Open an example and yield its jobs, tagged ``(example_id, job.tag)``."""
        st = OpenExample(example_id, state, outstanding=len(jobs), requests=len(jobs))
        self.open[example_id] = st
        for job in jobs:
            yield replace(job, tag=(example_id, job.tag))

    def emit(self, rows: list[dict], rejects: list[dict] = ()) -> None:  # type: ignore[assignment]
        """The outcome of one finished example (also one that needed no request)."""
        self._rows.extend(rows)
        self._rejects.extend(rejects)
        self._examples += 1
        if self._examples >= self.chunk:
            self.flush()

    def flush(self) -> None:
        """Write what finished as a shard; then the stage's own ``after_flush`` (the judge
        stores finished rows in the cache only after the rows are on disk)."""
        if self._rows or self._rejects:
            self.out.write_shard(self._rows, self._rejects)
        self._rows, self._rejects, self._examples = [], [], 0
        if self.after_flush is not None:
            self.after_flush()

    # ---- the loop -----------------------------------------------------------------------
    async def drive(
        self,
        runner: LLMRunner,
        jobs: Iterable[Job],
        on_outcome: OnOutcome,
        on_complete: OnComplete,
        total: int | None = None,
    ) -> None:
        """Answer every job; finish each example when its last answer is in."""
        try:
            async for (ex_id, key), outcome in runner.run(jobs, total=total):
                st = self.open[ex_id]
                if isinstance(outcome, Failure):
                    if outcome.final:
                        st.failed = True
                    else:
                        st.pending = True
                else:
                    st.reasks += outcome.reasks
                follow = [] if st.pending else list(on_outcome(st, key, outcome))
                st.outstanding -= 1
                for job in follow:
                    st.outstanding += 1
                    st.requests += 1
                    runner.push(replace(job, tag=(ex_id, job.tag)))
                if st.outstanding:
                    continue
                del self.open[ex_id]
                if st.pending:
                    self.pending += 1  # retried on the next run; nothing is written
                    continue
                rows, rejects = on_complete(st)
                self.emit(rows, rejects)
        finally:
            self.flush()  # finished examples are kept, also when the stage stops early
