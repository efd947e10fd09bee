"""An OpenAI-compatible LLM engine emulator with a continuous-batching timing model."""
