"""The kinds floor: what each extensible kind of engine is and the registry that names its
implementations, below the config, the engines and the commands, which all import it and
which it never imports (a registry names its built-in entries as ``"module:Class"``
strings, imported when chosen).

- ``backend``: :class:`Backend`, the backends' interface, and ``BACKENDS``;
- ``settings``: the ``backend`` config section and each backend's settings;
- ``dialect``: a structured-output dialect of an OpenAI-compatible server and
  ``DIALECTS``;
- ``stages``: ``STAGES`` and ``ORDER``, the stages' run order.

The kinds below this floor (input formats, pair rules) live with their rules in
``pipeline/inputs/`` and ``pipeline/rules/``.
"""
