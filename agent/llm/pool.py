"""Building the language model a run talks to: `make_provider` turns a `--model` spec into the provider registered
for its prefix (agent.llm.chat), or into a `ModelPool` of several; `load_prices` reads the price table.

A provider turns a list of messages into one `Reply`, retrying transient failures itself; anything it cannot recover
from ends in a `ProviderError` whose message is one sentence telling the user what to do. `make_provider(None)` returns
None when no model is configured: the loop then proposes with the offline tuner.

The SDKs (openai, anthropic) are imported only when a provider of theirs is made, so a tuner-only run needs neither.
"""
from __future__ import annotations

import importlib
import json
import os
import pkgutil
import random
from pathlib import Path
from pydantic import ValidationError

from agent.llm.chat import Message, Price, Provider, ProviderError, Reply, registered

MODEL_ENV = "CRUCIBLE_MODEL"
PRICES_ENV = "CRUCIBLE_PRICES"
# Specs that mean "no language model": the loop proposes with the offline tuner.
TUNER_SPECS = ("tuner", "none")


class ModelPool:
    """Several models in one run (`--model openai:a,anthropic:b`): each request goes to one of them, drawn with a
    weight of (verified improvements + 1) / (spend + one request's worth). Spend is dollars when every model has a
    price, else requests (an unpriced model's dollars are unknown). The loop calls `pick` for each request and
    `credit` with each verdict; `complete` alone (as a plain Provider) uses `pick` too."""

    def __init__(self, providers: list[Provider], seed: int = 0):
        if len(providers) < 2:
            raise ValueError("a pool needs two or more models")
        self.providers = list(providers)
        self.name = ",".join(p.name for p in providers)
        priced = all(getattr(p, "price", None) is not None for p in providers)
        self.price = True if priced else None  # what --max-cost asks of a provider: every model has a price
        self.stats = {p.name: {"requests": 0, "improved": 0, "cost": 0.0} for p in providers}
        self._rng = random.Random(seed)

    def weight(self, name: str) -> float:
        s = self.stats[name]
        if self.price:
            spent = [v["cost"] / v["requests"] for v in self.stats.values() if v["requests"]]
            unit = sum(spent) / len(spent) if spent and sum(spent) > 0 else 1.0
            return (s["improved"] + 1) / (s["cost"] + unit)
        return (s["improved"] + 1) / (s["requests"] + 1)

    def pick(self) -> Provider:
        weights = [self.weight(p.name) for p in self.providers]
        choice = self._rng.choices(self.providers, weights=weights)[0]
        self.stats[choice.name]["requests"] += 1
        return choice

    def credit(self, name: str, *, improved: bool, cost: float | None) -> None:
        if name in self.stats:
            self.stats[name]["improved"] += int(improved)
            self.stats[name]["cost"] += cost or 0.0

    def complete(self, messages: list[Message], *, max_tokens: int, temperature: float) -> Reply:
        return self.pick().complete(messages, max_tokens=max_tokens, temperature=temperature)


def make_provider(spec: str | None, *, timeout_s: float = 120, prices: dict | None = None,
                  **options) -> Provider | None:
    """The provider for `spec` ("openai:NAME", "anthropic:NAME"), else for $CRUCIBLE_MODEL; None when neither is set.

    `prices` maps "provider:model" or "model" to {"input": usd_per_mtok, "output": usd_per_mtok}; without it the table
    comes from $CRUCIBLE_PRICES (a JSON file path or JSON text). `options` go to the provider class (stream,
    max_attempts, backoff_s, backoff_max_s, retry_after_cap_s, sleep).
    """
    if spec is None:
        spec = os.environ.get(MODEL_ENV) or None
    if spec is None or spec.strip().lower() in TUNER_SPECS:
        return None
    spec = spec.strip()
    if "," in spec:  # several models in one run
        specs = [s.strip() for s in spec.split(",") if s.strip()]
        made = [make_provider(s, timeout_s=timeout_s, prices=prices, **options) for s in specs]
        if len(made) < 2 or any(p is None for p in made):
            raise ProviderError(f"model spec {spec!r}: give two or more PROVIDER:MODEL specs separated by commas")
        return ModelPool(made)  # type: ignore[arg-type]
    kind, sep, model = spec.partition(":")
    kind = kind.lower()
    if not sep or not model.strip():
        raise ProviderError(f"model spec {spec!r} is not PROVIDER:MODEL; use openai:NAME (OpenAI or any "
                            "OpenAI-compatible server via OPENAI_BASE_URL) or anthropic:NAME")
    table = load_prices(prices)
    price = table.get(f"{kind}:{model}") or table.get(model)
    _register_providers()

    factory = registered(kind)
    if factory is not None:
        return factory(model, timeout_s=timeout_s, price=price, **options)
    raise ProviderError(f"unknown provider {kind!r} in {spec!r}; use openai:NAME (also for vLLM, SGLang, Ollama and "
                        "llama.cpp through OPENAI_BASE_URL) or anthropic:NAME")


def load_prices(prices: dict | None = None) -> dict[str, Price]:
    """The price table from `prices`, else from $CRUCIBLE_PRICES (file path or JSON text), else empty."""
    if prices is None:
        raw = os.environ.get(PRICES_ENV, "").strip()
        if not raw:
            return {}
        origin = PRICES_ENV
        if not raw.startswith("{"):
            path = Path(raw).expanduser()
            if not path.is_file():
                raise ProviderError(f"{PRICES_ENV}={raw} is neither JSON nor an existing file; point it at a JSON "
                                    'file like {"openai:gpt-x": {"input": 2.5, "output": 10}} (USD per million tokens)')
            raw, origin = path.read_text(encoding="utf-8"), str(path)
        try:
            prices = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ProviderError(f"the price table in {origin} is not valid JSON ({exc.msg} at line {exc.lineno}); "
                                "fix it or unset it") from None
    else:
        origin = "prices="
    if not isinstance(prices, dict):
        raise ProviderError(f"the price table in {origin} must be a JSON object mapping model to "
                            '{"input": USD, "output": USD} per million tokens')
    table = {}
    for key, value in prices.items():
        try:
            table[str(key)] = value if isinstance(value, Price) else Price.model_validate(value)
        except ValidationError:
            raise ProviderError(f"the price of {key!r} in {origin} must be {{\"input\": USD, \"output\": USD}} per "
                                "million tokens, both non-negative numbers") from None
    return table


def _register_providers() -> None:
    """Import every module of agent.llm.providers, each of which registers its provider (their SDKs load on first
    use)."""
    from agent.llm import providers

    for module in pkgutil.iter_modules(providers.__path__, f"{providers.__name__}."):
        importlib.import_module(module.name)
