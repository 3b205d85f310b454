"""vLLM environment variables the config may name that vLLM no longer reads. No vllm import."""

# Environment variables vLLM no longer reads as of 0.26, with what replaced them. The plan drops them and
# says so, rather than passing dead settings to the engine.
VLLM_ENV_REMOVED_IN_0_26: dict[str, str] = {
    "VLLM_USE_V1": "the V1 engine is the only engine; drop the variable",
    "VLLM_ATTENTION_BACKEND": "pick the backend with the engine argument attention_backend instead",
}

__all__ = ["VLLM_ENV_REMOVED_IN_0_26"]
