"""Every file and folder name of a run directory, in one place.

::

    <run>/
      run.yaml             the resolved config of the latest `prb run` (secrets never written)
      environment.json     machine and library versions of the latest `prb run`
      cache.sqlite         every LLM request and answer (pipeline/run/cache.py)
      openai-batches/      the Batch API's batches this run submitted (backend.openai.batch)
      .lock                held by the one process that writes the run (flock)
      .prb-run             the marker: `prb run` made (or adopted, when it was empty) this folder
      <stage>/             ingest, rubrics, responses, judge, pairs
        stage.json         the stage's fingerprint and settings, written first
        data-NNNNN.jsonl   rows, in shards
        rejects-NNNNN.jsonl  rows the stage rejected, with a reason
        stats.json         the stage's figures
        _DONE.json         the manifest, written last: the stage is finished
      annotate/round-N/    a human verification round (tasks, answers, verdicts, agreement)
      publish/             the release (`prb publish`), marked by .prb-release
      report/              the audit (`prb audit`)
      eval/                evaluations of reward models and judges (`prb eval`)
      batch/               batch files' state (`prb batch`): requests exported, answers imported

Only the ``pipeline.run`` package uses these names; every other module asks
:class:`pipeline.run.RunDir` for paths, so a guarantee added there (a manifest check, the
lock) holds for every reader.
"""

from __future__ import annotations

import re

RUN_CONFIG = "run.yaml"
ENVIRONMENT = "environment.json"
CACHE = "cache.sqlite"
# one record per batch submitted to the Batch API, and its downloaded results
# (pipeline/backends/openai/batch.py): a killed run polls these again, never resubmits
OPENAI_BATCHES = "openai-batches"
LOCK = ".lock"
# `prb run` writes only into a folder that is new, empty, marked by this file, or an earlier
# run (one made before the marker existed): never into a folder of the user's.
RUN_MARKER = ".prb-run"

STAGE_META = "stage.json"
STAGE_STATS = "stats.json"
STAGE_MARKER = "_DONE.json"
SHARD_RE = re.compile(r"^(data|rejects)-(\d{5})\.jsonl$")
# The fixed names a stage writes besides its shards: with SHARD_RE, every file a stage
# folder can hold that the stage wrote. A replaced stage loses exactly these (and their
# temporary files); anything else in the folder is a stranger and stays.
STAGE_FILES = (STAGE_META, STAGE_STATS, STAGE_MARKER)
# The fingerprint stage.json holds while the stage is being cleared: it matches no real
# fingerprint, so a kill in the middle of a clear makes the next run clear it again.
CLEARING = "(being cleared)"
# What a killed process leaves behind: temporary files (pipeline/core/io.py) and the trash of
# a stage folder being cleared.
TRASH_PREFIX = ".trash-"


def data_shard(n: int) -> str:
    return f"data-{n:05d}.jsonl"


def rejects_shard(n: int) -> str:
    return f"rejects-{n:05d}.jsonl"


ANNOTATE = "annotate"
ROUND_PREFIX = "round-"
ROUND_RE = re.compile(r"^round-(\d+)$")
# Files of one annotation round.
ROUND_TASKS = "tasks.json"  # what annotators see (imported into Label Studio)
ROUND_SIDES = "sides.json"  # the local answer key: which side is A, gold answers
ROUND_EXPORT = "export.json"  # project id, server URL, counts of the export
ROUND_ANNOTATIONS = "annotations.jsonl"
ROUND_VERDICTS = "verdicts.jsonl"
ROUND_ADJUDICATION = "adjudication.jsonl"
ROUND_AGREEMENT = "agreement.json"
ROUND_SKIPPED = "skipped.jsonl"

# `prb batch` (pipeline/batch/): what was exported and what was imported, in one SQLite
# file, and the request files written by default
BATCH = "batch"
BATCH_STATE = "state.sqlite"

RELEASE = "publish"
# A release folder `prb publish` wrote holds this file: only such a folder is ever replaced.
RELEASE_MARKER = ".prb-release"
RELEASE_SUMMARY = "release.json"
RELEASE_ALL = "all"  # the config with every category
REPORT = "report"
EVAL = "eval"
