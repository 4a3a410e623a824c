"""OpenAI Chat Completions, against OpenAI or any server that speaks its format (vLLM, SGLang, Ollama, llama.cpp).

Registered as `--model openai:NAME`; OPENAI_API_KEY and OPENAI_BASE_URL choose the key and the server. The retry
policy and error translation are the shared ones (sdk.py).
"""
from __future__ import annotations

from typing import Any

from agent.llm.chat import Message, Usage, register
from agent.llm.providers.sdk import MalformedReply, Raw, SDKProvider, error_param, error_text, str_or_none


@register("openai")
class OpenAIProvider(SDKProvider):
    """Chat Completions, plain or streamed (`stream=True`), against OpenAI or any server that speaks its format."""

    kind = "openai"
    key_env = "OPENAI_API_KEY"
    base_env = "OPENAI_BASE_URL"
    default_base = "https://api.openai.com/v1"
    wire_format = "OpenAI Chat Completions"

    def _make_client(self, key: str) -> Any:
        import openai

        return openai.OpenAI(api_key=key, base_url=self.base_url, timeout=self.timeout_s, max_retries=0)

    def _sdk_errors(self) -> tuple[type, type, type, type]:
        import openai

        return openai.APIStatusError, openai.APIConnectionError, openai.APITimeoutError, \
            openai.APIResponseValidationError

    def _adapt(self, exc: Exception) -> bool:
        text, param = error_text(exc).lower(), error_param(exc)
        # OpenAI's reasoning models take max_completion_tokens; many compatible servers only know max_tokens.
        if "max_tokens" not in self._dropped and (param == "max_tokens" or "max_completion_tokens" in text):
            self._dropped.add("max_tokens")
            return True
        if self.stream and "stream_options" not in self._dropped and (param == "stream_options"
                                                                       or "stream_options" in text):
            self._dropped.add("stream_options")
            return True
        return super()._adapt(exc)

    def _params(self, messages: list[Message], max_tokens: int, temperature: float) -> dict[str, Any]:
        params: dict[str, Any] = {"model": self.model, "messages": [m.model_dump() for m in messages]}
        params["max_completion_tokens" if "max_tokens" in self._dropped else "max_tokens"] = max_tokens
        if "temperature" not in self._dropped:
            params["temperature"] = temperature
        if self.stream:
            params["stream"] = True
            if "stream_options" not in self._dropped:
                params["stream_options"] = {"include_usage": True}
        return params

    def _request(self, messages: list[Message], max_tokens: int, temperature: float) -> Raw:
        params = self._params(messages, max_tokens, temperature)
        if self.stream:
            return self._read_stream(self.client.chat.completions.create(**params))
        completion = self.client.chat.completions.create(**params)
        choices = getattr(completion, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise MalformedReply("the reply has no choices")
        message = getattr(choices[0], "message", None)
        if message is None or not hasattr(message, "content"):
            raise MalformedReply("the first choice has no message content")
        content = message.content
        if content is not None and not isinstance(content, str):
            raise MalformedReply(f"message content is {type(content).__name__}, not text")
        return Raw(text=content or "", model=str_or_none(getattr(completion, "model", None)),
                    usage=_openai_usage(getattr(completion, "usage", None)),
                    finish_reason=str_or_none(getattr(choices[0], "finish_reason", None)))

    def _read_stream(self, stream: Any) -> Raw:
        parts: list[str] = []
        model = finish = None
        usage = None
        with stream:
            for chunk in stream:
                model = model or str_or_none(getattr(chunk, "model", None))
                usage = _openai_usage(getattr(chunk, "usage", None)) or usage
                for choice in getattr(chunk, "choices", None) or []:
                    delta = getattr(choice, "delta", None)
                    piece = getattr(delta, "content", None) if delta is not None else None
                    if isinstance(piece, str):
                        parts.append(piece)
                    finish = str_or_none(getattr(choice, "finish_reason", None)) or finish
        if finish is None:  # every complete stream ends its choice with a finish_reason; this one was cut
            raise MalformedReply("the stream ended before a finish_reason")
        return Raw(text="".join(parts), model=model, usage=usage, finish_reason=finish)


def _openai_usage(usage: Any) -> Usage | None:
    if usage is None:
        return None
    inp, out = getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
    if not isinstance(inp, int) and not isinstance(out, int):
        return None
    return Usage(input_tokens=inp if isinstance(inp, int) else 0, output_tokens=out if isinstance(out, int) else 0)
