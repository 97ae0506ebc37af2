"""The progress line of a stage: requests done of expected, sent vs cached, failures,
tokens generated and their rate (tokens/s), elapsed and remaining time. Shown only on a
terminal; quiet otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """One tqdm line per stage, fed by the LLM runner (or a stage without LLM calls)."""

    def __init__(self, stage: str, total: int | None = None, enabled: bool = True) -> None:
        from tqdm.auto import tqdm

        self.stage = stage
        self.sent = self.cached = self.failed = self.tokens = 0
        self._start = time.monotonic()
        show = enabled and sys.stderr.isatty()
        self._bar = tqdm(
            total=total,
            desc=f"[{stage}]",
            unit="req",
            disable=not show,
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.5,
            smoothing=0.05,
        )

    def add_total(self, n: int) -> None:
        """Grow the expected count (follow-up requests only known as work completes)."""
        if self._bar.total is not None:
            self._bar.total += n

    def update(
        self, n: int = 1, *, cached: bool = False, failed: bool = False, tokens: int = 0
    ) -> None:
        if failed:
            self.failed += n
        elif cached:
            self.cached += n
        else:
            self.sent += n
        self.tokens += tokens
        self._bar.update(n)
        self._bar.set_postfix_str(self.postfix(), refresh=False)

    def tokens_per_s(self) -> float:
        """Answer tokens generated per second since the stage began (cached answers add
        none): the engine's speed as this stage sees it."""
        elapsed = time.monotonic() - self._start
        return self.tokens / elapsed if elapsed > 0 else 0.0

    def postfix(self) -> str:
        return (
            f"sent {self.sent} cached {self.cached} failed {self.failed} "
            f"tokens {self.tokens} ({self.tokens_per_s():.1f} tok/s)"
        )

    def summary(self) -> dict[str, Any]:
        return {"sent": self.sent, "cached": self.cached, "failed": self.failed,
                "tokens": self.tokens,
                "tokens_per_s": round(self.tokens_per_s(), 1)}  # fmt: skip

    def close(self) -> None:
        self._bar.close()


class BatchProgress:
    """One tqdm line per batch of the Batch API while it is polled: lines answered of the
    batch's total, and its status (validating, in_progress, finalizing...)."""

    def __init__(self, batch_id: str, total: int, enabled: bool = True) -> None:
        from tqdm.auto import tqdm

        self._bar = tqdm(
            total=total or None,
            desc=f"[batch {batch_id}]",
            unit="req",
            disable=not (enabled and sys.stderr.isatty()),
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.5,
        )

    def update(self, status: str, completed: int, failed: int, total: int) -> None:
        """The batch's status and ``request_counts`` as the latest poll reported them."""
        if total and self._bar.total != total:
            self._bar.total = total
        done = completed + failed
        if done > self._bar.n:
            self._bar.update(done - self._bar.n)
        self._bar.set_postfix_str(f"{status}, {failed} failed", refresh=True)

    def close(self) -> None:
        self._bar.close()
