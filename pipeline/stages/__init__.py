"""The pipeline's stages, one module each, on ``pipeline.stages.base.Stage``. Their registry
and run order live below, in ``pipeline/kinds/stages.py`` (``STAGES``, ``ORDER``)."""
