"""The pipeline's stages, one module each, on ``pipeline.stages.base.Stage``, and their
registry. Adding one: a module with a ``Stage`` subclass, its line here and its place in
the run order (``ORDER``, ``pipeline/kinds/stages.py``, below everything that names a
stage)."""

from pipeline.core.registry import Registry
from pipeline.stages.base import Stage

STAGES: Registry[type[Stage]] = Registry("stage", Stage)
STAGES.register("ingest", "pipeline.stages.ingest:IngestStage")
STAGES.register("rubrics", "pipeline.stages.rubrics:RubricStage")
STAGES.register("responses", "pipeline.stages.responses:ResponseStage")
STAGES.register("judge", "pipeline.stages.judge:JudgeStage")
STAGES.register("pairs", "pipeline.stages.pairs:PairStage")

__all__ = ["STAGES"]
