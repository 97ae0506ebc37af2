"""Human verification rounds: Label Studio tasks out, annotations and agreement back in.

- ``cli``: the ``prb annotate`` parser and handler (registered by pipeline/cli/prb.py).
- ``errors``: :class:`LabelStudioError`, shared by the other modules.
- ``tasks``: sample pairs, build gold tasks and the Label Studio task payloads (no server).
- ``server``: run a local Label Studio in its own virtualenv (``prb annotate serve``).
- ``export``: send a round's tasks to a project (``prb annotate export``).
- ``importer``: pull annotations back, map A/B to chosen/rejected, write verdicts
  (``prb annotate import``).
- ``agreement``: alpha, kappa and friends, computed here because the open-source server does
  not.

Heavy imports (the Label Studio SDK) happen inside the functions that need them. This
``__init__`` imports nothing: each submodule imports what it uses from its siblings, so
no import runs through the package and back.
"""
