"""The ``openai`` backend, one package: any OpenAI-compatible server (vLLM's ``vllm serve``,
llama-cpp-python's server, OpenAI itself).

- ``wire``: where requests go, a reply read as a result, which errors a retry helps, what a
  refusal names, whether the server can be reached (everything below reads it);
- ``ratelimit``: sending no faster than the server's limits;
- ``dialects``: what one server accepts (the structured-output dialects, each a registered
  class: ``DIALECTS``), and ``auto``'s probe;
- ``lines``: the Batch API's JSONL line format (also the ``batchfile`` backend's);
- ``batch``: the Batch API mode;
- ``backend``: :class:`OpenAIBackend`, which the backend registry names.

Modules outside the package import what they need from these; none of them imports a
module above it (``backend`` imports ``batch`` and ``dialects``, never the other way).
"""
