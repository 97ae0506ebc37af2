"""The stages' run order, by name: the run directory's folders and every command that names
a stage know it from here, below the stages themselves. Their classes are registered with
the ``Stage`` base, in ``pipeline/stages/__init__.py`` (``STAGES``)."""

ORDER: tuple[str, ...] = ("ingest", "rubrics", "responses", "judge", "pairs")

__all__ = ["ORDER"]
