"""The child process of tests/test_crash_consistency.py: runs the pipeline with failpoint
settings in its environment. Started with the ``spawn`` method, so it begins as a fresh
interpreter: forking a parent that runs threads (the stand-in server, pytest's timeout
thread) can copy a lock held by one of them into the child, which then hangs."""

from __future__ import annotations

import os


def run(cfg: str, env: dict[str, str]) -> None:
    os.environ.update(env)
    from pipeline.config import load_config
    from pipeline.orchestrate import run_pipeline

    code = 1
    try:
        run_pipeline(load_config(cfg), progress=False, echo=lambda s: None)
        code = 0
    finally:
        os._exit(code)
