"""Input formats, looked up by name (``input.format``). Adding one: a subclass of
``InputFormat`` and a registration (here for a built-in one, ``FORMATS.register`` or
``@register_format`` anywhere else); docs/inputs.md. Built-in readers are imported only
when chosen, so ``datasets`` stays out of a JSONL run."""

from pipeline.inputs.base import FORMATS, InputFormat, InputSection, register_format

FORMATS.register("lamp", "pipeline.inputs.jsonl:LampFormat")
FORMATS.register("generic", "pipeline.inputs.jsonl:GenericFormat")
FORMATS.register("hf", "pipeline.inputs.tables:HFFormat")
FORMATS.register("hub", "pipeline.inputs.tables:HubFormat")

__all__ = ["FORMATS", "InputFormat", "InputSection", "register_format"]
