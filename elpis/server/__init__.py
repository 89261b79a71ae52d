"""OpenAI-compatible HTTP server (aiohttp): auth, validation, queueing, true SSE streaming, reasoning and
Qwen tool-call parsing, usage with cached tokens and speculation stats. Entry point: `elpis serve`."""
