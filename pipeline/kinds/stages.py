"""The stages, by name, and their run order. Adding one: a module with a ``Stage`` subclass
(``pipeline/stages/base.py``) and a line here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.core.registry import Registry

if TYPE_CHECKING:
    from pipeline.stages.base import Stage

STAGES: Registry[type[Stage]] = Registry("stage", "pipeline.stages.base:Stage")
STAGES.register("ingest", "pipeline.stages.ingest:IngestStage")
STAGES.register("rubrics", "pipeline.stages.rubrics:RubricStage")
STAGES.register("responses", "pipeline.stages.responses:ResponseStage")
STAGES.register("judge", "pipeline.stages.judge:JudgeStage")
STAGES.register("pairs", "pipeline.stages.pairs:PairStage")

# Run order (the registry itself is unordered).
ORDER: tuple[str, ...] = ("ingest", "rubrics", "responses", "judge", "pairs")

__all__ = ["ORDER", "STAGES"]
