"""The provider interface: typed messages and replies, token usage and prices, the Provider protocol, the error a
provider ends in, and the registry that maps a `--model` prefix to the provider class that serves it.

A provider is one module that defines its class and registers it (`@register("openai")`); agent.llm.pool imports the
provider modules and makes the provider a spec names. Everything here is plain data and imports no SDK.
"""
from __future__ import annotations

from typing import Any, Callable, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field


class Message(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant"]
    content: str


class Usage(BaseModel):
    model_config = ConfigDict(frozen=True)

    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)


class Reply(BaseModel):
    """One completed request. `latency_s` is the wall time of the whole call, retries and their waits included."""

    model_config = ConfigDict(frozen=True)

    text: str
    model: str  # the model that answered, as the server reports it (falls back to the requested name)
    provider: str  # the provider's name, e.g. "openai:gpt-x"
    usage: Usage
    cost_usd: float | None  # None when the model has no configured price (never guessed)
    latency_s: float = Field(ge=0)
    attempts: int = Field(ge=1)
    finish_reason: str | None = None  # "stop", "length", "end_turn", "max_tokens"... as the server says


class Price(BaseModel):
    """USD per million tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(ge=0)
    output: float = Field(ge=0)

    def cost(self, usage: Usage) -> float:
        return (usage.input_tokens * self.input + usage.output_tokens * self.output) / 1e6


@runtime_checkable
class Provider(Protocol):
    name: str  # "openai:gpt-x", "anthropic:claude-y", "fake", ...

    def complete(self, messages: list[Message], *, max_tokens: int, temperature: float) -> Reply: ...


class ProviderError(Exception):
    """A failure the provider could not recover from; the message is one sentence for the user.

    `transient` is True when the cause may pass by itself (rate limits, server errors, an endpoint down, malformed
    replies, all after the retries ran out), False when the user must change something (key, model name, spec).
    """

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


ProviderFactory = Callable[..., Provider]  # (model, *, timeout_s, price, **options) -> Provider
_REGISTRY: dict[str, ProviderFactory] = {}


def register(prefix: str) -> Callable[[Any], Any]:
    """Class decorator: the provider for `--model PREFIX:NAME`, built as cls(NAME, timeout_s=..., price=...,
    **options)."""
    def add(cls: Any) -> Any:
        if prefix in _REGISTRY and _REGISTRY[prefix] is not cls:
            raise ValueError(f"two providers registered for the prefix {prefix!r}")
        _REGISTRY[prefix] = cls
        return cls
    return add


def registered(prefix: str) -> ProviderFactory | None:
    """The provider class registered for `prefix`, or None."""
    return _REGISTRY.get(prefix)
