"""What drives a backend: the runner that sends a stage's requests through the cache, with
re-asks and progress (``llm``), and what a run may spend (``budget``)."""
