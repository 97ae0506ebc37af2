"""The child process of tests/test_crash_consistency.py: runs the pipeline with failpoint
settings in its environment. Started with the ``spawn`` method, so it begins as a fresh
interpreter: forking a parent that runs threads (the stand-in server, pytest's timeout
thread) can copy a lock held by one of them into the child, which then hangs."""

from __future__ import annotations

import os


def run(cfg: str, env: dict[str, str]) -> None:
    os.environ.update(env)
    from pipeline.config import load_config
    from pipeline.orchestration.orchestrate import run_pipeline

    code = 1
    try:
        run_pipeline(load_config(cfg), progress=False, echo=lambda s: None)
        code = 0
    finally:
        os._exit(code)


def run_bon_crashing(argv: list[str], chunk: int, after: int) -> None:
    """`prb eval bon` (in this fresh interpreter) with reward-model scores committed every
    ``chunk`` answers, killed (``os._exit``: no finally block, flush or atexit hook runs,
    as a SIGKILL) right after the ``after``-th committed chunk."""
    import pipeline.eval.bonscore as bonscore
    from pipeline.cli import main

    bonscore.SCORE_CHUNK = chunk
    seen = [0]
    real = bonscore.crash_point

    def crash_point(label: str) -> None:
        real(label)
        if label == "bon rm scores":
            seen[0] += 1
            if seen[0] == after:
                os._exit(86)

    bonscore.crash_point = crash_point  # type: ignore[attr-defined]
    code = 1
    try:
        code = main(argv)
    finally:
        os._exit(code)
