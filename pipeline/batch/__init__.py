"""Batch files: the requests a run would send, written as OpenAI batch JSONL for a runner
with no server (vLLM's ``run_batch`` on a cluster), and its result lines read back into the
run's cache (docs/batch.md). ``lines`` is the format, shared with the Batch API mode."""
