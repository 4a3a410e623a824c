"""A provider that replays queued replies and records what it was asked (simonw/llm's MockModel, for tests).

    fake = FakeProvider()
    fake.enqueue("```python\\n...\\n```").enqueue_error(ProviderError("rate limited", transient=True))
    reply = fake.complete(messages, max_tokens=4096, temperature=0.7)
    fake.calls[0].messages  # what the loop sent

Thread-safe: the loop may ask from several threads at once. An empty queue raises ProviderError (or returns
`default` when one was given), so a test that asks more often than it planned fails loudly.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from agent.llm.chat import Message, Price, ProviderError, Reply, Usage


@dataclass(frozen=True)
class FakeCall:
    messages: tuple[Message, ...]
    max_tokens: int
    temperature: float

    @property
    def prompt(self) -> str:
        """The messages as one text, for `in` assertions."""
        return "\n\n".join(f"[{m.role}]\n{m.content}" for m in self.messages)


@dataclass(frozen=True)
class _Queued:
    text: str | None
    error: BaseException | None
    usage: Usage
    delay_s: float
    finish_reason: str | None


class FakeProvider:
    def __init__(self, name: str = "fake", *, default: str | None = None, price: Price | None = None):
        self.name = name
        self.default = default
        self.price = price
        self.calls: list[FakeCall] = []
        self._queue: deque[_Queued] = deque()
        self._lock = threading.Lock()

    def enqueue(self, text: str, *, usage: Usage | None = None, delay_s: float = 0.0,
                finish_reason: str | None = "stop") -> "FakeProvider":
        """Queue one reply; `delay_s` makes the call take that long (to exercise concurrency)."""
        with self._lock:
            self._queue.append(_Queued(text, None, usage or Usage(), delay_s, finish_reason))
        return self

    def enqueue_error(self, exc: BaseException, *, delay_s: float = 0.0) -> "FakeProvider":
        """Queue an exception the next call raises (a ProviderError, as a real provider would raise)."""
        with self._lock:
            self._queue.append(_Queued(None, exc, Usage(), delay_s, None))
        return self

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def prompts(self) -> list[str]:
        with self._lock:
            return [c.prompt for c in self.calls]

    def complete(self, messages: list[Message], *, max_tokens: int, temperature: float) -> Reply:
        start = time.monotonic()
        with self._lock:
            self.calls.append(FakeCall(tuple(messages), max_tokens, temperature))
            item = self._queue.popleft() if self._queue else None
        if item is None:
            if self.default is None:
                raise ProviderError(f"the fake provider {self.name!r} has no queued reply left "
                                    f"(call {len(self.calls)}); enqueue more replies in the test")
            item = _Queued(self.default, None, Usage(), 0.0, "stop")
        if item.delay_s:
            time.sleep(item.delay_s)
        if item.error is not None:
            raise item.error
        cost = self.price.cost(item.usage) if self.price is not None else None
        return Reply(text=item.text or "", model=self.name, provider=self.name, usage=item.usage, cost_usd=cost,
                     latency_s=time.monotonic() - start, attempts=1, finish_reason=item.finish_reason)
