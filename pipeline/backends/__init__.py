"""LLM backends, looked up by name. Heavy engines are imported only when chosen."""

from pipeline.registry import Registry

BACKENDS = Registry("backend")
BACKENDS.register("openai", "pipeline.backends.openai_backend:OpenAIBackend")
BACKENDS.register("vllm", "pipeline.backends.vllm_backend:VLLMBackend")
BACKENDS.register("llamacpp", "pipeline.backends.llamacpp_backend:LlamaCppBackend")
BACKENDS.register("replay", "pipeline.backends.replay:ReplayBackend")
BACKENDS.register("ray", "pipeline.backends.ray_backend:RayBackend")

__all__ = ["BACKENDS"]
