"""The progress line: counts and the rate of generated tokens."""

from __future__ import annotations

import time

from pipeline.core.progress import Progress


def test_progress_counts_and_shows_tokens_per_second(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    p = Progress("judge", total=4, enabled=False)
    p.update(tokens=120)
    p.update(cached=True)  # a cached answer generated nothing
    p.update(failed=True)
    clock[0] += 4.0
    p.update(tokens=80)
    assert p.summary() == {"sent": 2, "cached": 1, "failed": 1, "tokens": 200,
                           "tokens_per_s": 50.0}  # fmt: skip
    assert p.postfix() == "sent 2 cached 1 failed 1 tokens 200 (50.0 tok/s)"
    p.close()


def test_no_time_elapsed_is_no_rate(monkeypatch):
    monkeypatch.setattr(time, "monotonic", lambda: 5.0)
    p = Progress("responses", enabled=False)
    p.update(tokens=10)
    assert p.tokens_per_s() == 0.0
    p.close()
