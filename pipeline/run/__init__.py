"""The run directory: the only code that knows its layout (``layout``), reads its
metadata into typed objects (``meta``), verifies finished stages (``stage``), holds its
lock (``lock``) and hands every command the paths and the verified reads it needs
(``rundir``). See docs/architecture.md.
"""

from pipeline.run.lock import RunLock
from pipeline.run.rundir import (
    STAGE_NAMES,
    Round,
    RunDir,
    check_round_number,
    default_eval_root,
    open_run,
    run_of,
)
from pipeline.run.stage import ShardIndex, StageDir, redo_hint, run_hint

__all__ = [
    "STAGE_NAMES",
    "Round",
    "RunDir",
    "RunLock",
    "ShardIndex",
    "StageDir",
    "check_round_number",
    "default_eval_root",
    "open_run",
    "redo_hint",
    "run_hint",
    "run_of",
]
