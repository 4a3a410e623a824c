"""The Anthropic Messages API; system messages go to the `system` parameter.

Registered as `--model anthropic:NAME`; ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) and ANTHROPIC_BASE_URL choose the
key and the server. The retry policy and error translation are the shared ones (sdk.py).
"""
from __future__ import annotations

import os
from typing import Any

from agent.llm.chat import Message, Usage, register
from agent.llm.providers.sdk import MalformedReply, Raw, SDKProvider, str_or_none


@register("anthropic")
class AnthropicProvider(SDKProvider):
    """The Messages API, plain or streamed (`stream=True`); system messages go to the `system` parameter."""

    kind = "anthropic"
    key_env = "ANTHROPIC_API_KEY"
    base_env = "ANTHROPIC_BASE_URL"
    default_base = "https://api.anthropic.com"
    wire_format = "Anthropic Messages"

    def _extra_key(self) -> str | None:
        return os.environ.get("ANTHROPIC_AUTH_TOKEN")

    def _make_client(self, key: str) -> Any:
        import anthropic

        return anthropic.Anthropic(api_key=key, base_url=self.base_url, timeout=self.timeout_s, max_retries=0)

    def _sdk_errors(self) -> tuple[type, type, type, type]:
        import anthropic

        return anthropic.APIStatusError, anthropic.APIConnectionError, anthropic.APITimeoutError, \
            anthropic.APIResponseValidationError

    def _params(self, messages: list[Message], max_tokens: int, temperature: float) -> dict[str, Any]:
        system = "\n\n".join(m.content for m in messages if m.role == "system")
        turns: list[dict[str, str]] = []
        for m in messages:
            if m.role == "system":
                continue
            if turns and turns[-1]["role"] == m.role:  # the API wants alternating turns
                turns[-1]["content"] += "\n\n" + m.content
            else:
                turns.append({"role": m.role, "content": m.content})
        params: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "messages": turns}
        if system:
            params["system"] = system
        if "temperature" not in self._dropped:
            # Through extra_body: recent SDKs dropped the keyword (newer models refuse sampling parameters, and a
            # refusal makes _adapt stop sending it); older SDKs and other servers still take it.
            params["extra_body"] = {"temperature": temperature}
        return params

    def _request(self, messages: list[Message], max_tokens: int, temperature: float) -> Raw:
        params = self._params(messages, max_tokens, temperature)
        if self.stream:
            return self._read_stream(self.client.messages.create(stream=True, **params))
        message = self.client.messages.create(**params)
        content = getattr(message, "content", None)
        if not isinstance(content, list):
            raise MalformedReply("the reply has no content list")
        text = "".join(getattr(block, "text", "") or "" for block in content
                       if getattr(block, "type", None) == "text")
        return Raw(text=text, model=str_or_none(getattr(message, "model", None)),
                    usage=_anthropic_usage(getattr(message, "usage", None), None),
                    finish_reason=str_or_none(getattr(message, "stop_reason", None)))

    def _read_stream(self, stream: Any) -> Raw:
        parts: list[str] = []
        model = finish = None
        start_usage = end_usage = None
        stopped = False
        with stream:
            for event in stream:
                kind = getattr(event, "type", None)
                if kind == "message_start":
                    msg = getattr(event, "message", None)
                    model = str_or_none(getattr(msg, "model", None))
                    start_usage = getattr(msg, "usage", None)
                elif kind == "content_block_delta":
                    delta = getattr(event, "delta", None)
                    if getattr(delta, "type", None) == "text_delta":
                        parts.append(getattr(delta, "text", "") or "")
                elif kind == "message_delta":
                    finish = str_or_none(getattr(getattr(event, "delta", None), "stop_reason", None)) or finish
                    end_usage = getattr(event, "usage", None) or end_usage
                elif kind == "message_stop":
                    stopped = True
        if not stopped:
            raise MalformedReply("the stream ended before message_stop")
        return Raw(text="".join(parts), model=model, usage=_anthropic_usage(start_usage, end_usage),
                    finish_reason=finish)


def _anthropic_usage(start: Any, end: Any) -> Usage | None:
    """Input tokens (cache writes and reads included) from the message or its start event; output from the end."""
    source_in = start if start is not None else end
    if source_in is None:
        return None
    inp = sum(v for v in (getattr(source_in, name, None) for name in
                          ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
              if isinstance(v, int))
    out = getattr(end if end is not None else start, "output_tokens", None)
    return Usage(input_tokens=inp, output_tokens=out if isinstance(out, int) else 0)
