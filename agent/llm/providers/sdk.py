"""What the SDK-backed providers share: one retry policy, error translation and token accounting.

The providers (openai.py, anthropic.py beside this module) go through their official SDKs with the SDKs' own retries
switched off, so that one policy (tenacity, below) decides: rate limits (429, honouring Retry-After up to a cap), 408/409, 5xx, timeouts, dropped connections and
malformed replies are retried with exponential backoff; anything else fails at once. Whatever cannot be recovered
ends in a ProviderError of one sentence. Keys and base URLs come from the SDKs' usual variables.
"""
from __future__ import annotations

import abc
import email.utils
import json
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Callable

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from agent.llm.chat import Message, Price, ProviderError, Reply, Usage

log = logging.getLogger(__name__)

RETRY_STATUS = (408, 409, 429)  # plus every 5xx
# A local server (vLLM, Ollama, llama.cpp) usually ignores the key; the SDK still insists on one.
LOCAL_KEY_PLACEHOLDER = "no-key"


class MalformedReply(Exception):
    """The server answered 2xx but not with a usable reply (bad JSON, no choices, no content field)."""


@dataclass
class Raw:
    """One reply as the SDK returned it, before accounting."""

    text: str
    model: str | None
    usage: Usage | None  # None when the server reported no usage
    finish_reason: str | None


class SDKProvider(abc.ABC):
    """The retry policy, error translation and accounting shared by the SDK-backed providers."""

    kind = ""  # "openai" | "anthropic"
    key_env = ""
    base_env = ""
    default_base = ""
    wire_format = ""

    def __init__(self, model: str, *, timeout_s: float = 120, price: Price | None = None, stream: bool = False,
                 max_attempts: int = 6, backoff_s: float = 1.0, backoff_max_s: float = 60.0,
                 retry_after_cap_s: float = 60.0, sleep: Callable[[float], None] = time.sleep,
                 api_key: str | None = None, base_url: str | None = None):
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.model = model
        self.name = f"{self.kind}:{model}"
        self.timeout_s = timeout_s
        self.price = price
        self.stream = stream
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.retry_after_cap_s = retry_after_cap_s
        self._sleep = sleep
        self.base_url = (base_url or os.environ.get(self.base_env) or "").strip() or None
        key = api_key or os.environ.get(self.key_env) or self._extra_key()
        if not key:
            if self.base_url is None:
                raise ProviderError(f"{self.name} needs an API key: set {self.key_env} (or point {self.base_env} at a "
                                    "local server), or run without --model to use the offline tuner")
            log.info("%s: no %s set; sending a placeholder key to %s", self.name, self.key_env, self.base_url)
            key = LOCAL_KEY_PLACEHOLDER
        self.endpoint = self.base_url or self.default_base
        self._dropped: set[str] = set()  # request parameters this server refused and we stopped sending
        self.client = self._make_client(key)

    # ---- provider-specific ----------------------------------------------------------------------------------
    def _extra_key(self) -> str | None:
        return None

    @abc.abstractmethod
    def _make_client(self, key: str) -> Any:
        """The SDK client, with the SDK's own retries off (tenacity is the one retry policy)."""

    @abc.abstractmethod
    def _request(self, messages: list[Message], max_tokens: int, temperature: float) -> Raw:
        """One request through the SDK, plain or streamed."""

    @abc.abstractmethod
    def _sdk_errors(self) -> tuple[type, type, type, type]:
        """The SDK's (APIStatusError, APIConnectionError, APITimeoutError, APIResponseValidationError)."""

    def _adapt(self, exc: Exception) -> bool:
        """After a 400: stop sending a parameter the server said it does not support; True when something changed."""
        text = error_text(exc).lower()
        param = error_param(exc)
        if "temperature" not in self._dropped and (param == "temperature" or "temperature" in text):
            self._dropped.add("temperature")
            return True
        return False

    # ---- the call ---------------------------------------------------------------------------------------------
    def complete(self, messages: list[Message], *, max_tokens: int, temperature: float) -> Reply:
        if not messages:
            raise ValueError("complete() needs at least one message")
        status_error = self._sdk_errors()[0]
        start = time.monotonic()
        attempts = 0

        def attempt() -> Raw:
            nonlocal attempts
            attempts += 1
            return self._request(messages, max_tokens, temperature)

        for _ in range(4):  # a server may refuse up to a few parameters, one per 400
            try:
                raw = self._retrying()(attempt)
                break
            except status_error as exc:
                if getattr(exc, "status_code", None) == 400 and self._adapt(exc):
                    log.info("%s: the server refused a parameter (%s); retrying without it", self.name,
                             error_text(exc)[:200])
                    continue
                raise self._translate(exc, attempts) from None
            except Exception as exc:  # noqa: BLE001 - every SDK/transport failure becomes one sentence
                log.debug("%s: request failed", self.name, exc_info=exc)
                raise self._translate(exc, attempts) from None
        else:
            raise ProviderError(f"{self.endpoint} kept refusing the request parameters for {self.name}; "
                                "check that the model name is right for this server")
        latency = time.monotonic() - start
        usage = raw.usage or Usage()
        cost = self.price.cost(usage) if (self.price is not None and raw.usage is not None) else None
        return Reply(text=raw.text, model=raw.model or self.model, provider=self.name, usage=usage, cost_usd=cost,
                     latency_s=latency, attempts=attempts, finish_reason=raw.finish_reason)

    def _retrying(self) -> Retrying:
        return Retrying(stop=stop_after_attempt(self.max_attempts), wait=self._wait,
                        retry=retry_if_exception(self._retryable), sleep=self._sleep, reraise=True,
                        before_sleep=self._log_retry)

    def _retryable(self, exc: BaseException) -> bool:
        status_error, connection_error, _, validation_error = self._sdk_errors()
        if isinstance(exc, (MalformedReply, json.JSONDecodeError, connection_error, validation_error)):
            return True
        if isinstance(exc, status_error):
            code = exc.status_code
            # An error event inside a 200 stream (e.g. "overloaded") arrives as a status error with code 200.
            return code in RETRY_STATUS or code >= 500 or code < 400
        return _is_transport_error(exc)

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        hinted = retry_after_seconds(exc) if exc is not None else None
        if hinted is not None:
            return min(max(hinted, 0.0), self.retry_after_cap_s)
        backoff = self.backoff_s * 2 ** (state.attempt_number - 1)
        return min(backoff, self.backoff_max_s) * (0.5 + 0.5 * _jitter())

    def _log_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        log.info("%s: attempt %d failed (%s); retrying in %.2fs", self.name, state.attempt_number,
                    _short(exc), wait)

    def _translate(self, exc: BaseException, attempts: int) -> ProviderError:
        """One sentence for the user, saying what to do."""
        status_error, connection_error, timeout_error, validation_error = self._sdk_errors()
        tries = f"after {attempts} attempt{'s' if attempts != 1 else ''}"
        where = self.endpoint
        if isinstance(exc, timeout_error):
            return ProviderError(f"{where} did not answer {self.name} within {self.timeout_s:g}s {tries}; check the "
                                 "server or raise the request timeout", transient=True)
        if isinstance(exc, connection_error) or _is_transport_error(exc):
            return ProviderError(f"could not reach {where} {tries} ({_short(exc)}); check that the server is running "
                                 f"and that {self.base_env} points at it", transient=True)
        if isinstance(exc, (MalformedReply, json.JSONDecodeError, validation_error)):
            return ProviderError(f"{where} sent malformed replies to {self.name} {tries} ({_short(exc)}); check that "
                                 f"it speaks the {self.wire_format} format", transient=True)
        if isinstance(exc, status_error):
            code, detail = exc.status_code, error_text(exc)[:200]
            if code == 401:
                return ProviderError(f"{where} rejected the API key (401: {detail}); set a valid {self.key_env}")
            if code == 403:
                return ProviderError(f"{where} refused access to {self.model} (403: {detail}); check the key's "
                                     "permissions for this model")
            if code == 404:
                return ProviderError(f"{where} does not know model {self.model!r} or the URL is wrong (404: {detail}); "
                                     f"check the model name and {self.base_env}")
            if code == 429:
                return ProviderError(f"{where} kept rate-limiting {self.name} {tries} (429: {detail}); wait, lower "
                                     "the concurrency or raise the quota", transient=True)
            if code >= 500 or code < 400:
                return ProviderError(f"{where} kept failing for {self.name} {tries} (HTTP {code}: {detail}); try "
                                     "again later", transient=True)
            return ProviderError(f"{where} refused the request for {self.name} (HTTP {code}: {detail}); check the "
                                 "model name and the request options")
        return ProviderError(f"{self.name} failed {tries} with {type(exc).__name__}: {_short(exc)}")


# ---- helpers --------------------------------------------------------------------------------------------------
def retry_after_seconds(exc: BaseException) -> float | None:
    """The server's requested wait from retry-after-ms or Retry-After (seconds or an HTTP date), if any."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return float(ms) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when.timestamp() - time.time() if when is not None else None


def error_text(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return " ".join(err["message"].split())
        if isinstance(err, str):
            return " ".join(err.split())
    return " ".join(str(getattr(exc, "message", None) or exc).split())


def error_param(exc: BaseException) -> str | None:
    body = getattr(exc, "body", None)
    err = body.get("error", body) if isinstance(body, dict) else None
    return err.get("param") if isinstance(err, dict) and isinstance(err.get("param"), str) else None


def _is_transport_error(exc: BaseException) -> bool:
    # Both SDKs run on httpx2; a stream cut mid-way can surface as its transport error rather than the SDK's.
    for cls in type(exc).__mro__:
        if cls.__name__ == "TransportError" and cls.__module__.split(".")[0] in ("httpx", "httpx2"):
            return True
    return False


def str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _short(exc: BaseException | None) -> str:
    if exc is None:
        return "no error"
    text = error_text(exc) if hasattr(exc, "body") else " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


def _jitter() -> float:
    return random.random()
