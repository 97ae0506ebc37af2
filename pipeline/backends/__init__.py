"""The engines that answer chat requests: one module (or, for ``openai``, one package) per
backend. What a backend is and the registry that names them live below, in
``pipeline.kinds`` (``pipeline/kinds/backend.py``); nothing here is imported until a run
chooses it."""
