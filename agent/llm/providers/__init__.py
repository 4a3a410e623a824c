"""The LLM providers, one module each: a module defines its provider class and registers it under its `--model`
prefix with `agent.llm.chat.register`. `agent.llm.pool.make_provider` imports every module here before it looks a
prefix up, so adding a provider is adding one file. The SDK-backed ones share their retry policy (sdk)."""
