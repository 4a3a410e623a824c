"""Providers against a real loopback server speaking the OpenAI and Anthropic wire formats, through the real SDKs.

Backoff waits are made small through the providers' parameters; Retry-After waits are real sleeps and timed.
"""
from __future__ import annotations

import json
import threading
import time

import pytest

from agent.llm.extract import ExtractedCode, NoCode, extract_code
from agent.llm.fake import FakeProvider
from agent.llm.chat import Message, Price, ProviderError, Reply, Usage
from agent.llm.pool import load_prices, make_provider
from tests.llm_server import (ScriptedServer, anthropic_message, anthropic_stream, closed_port, json_reply,
                              openai_completion, openai_stream, raw_reply, sse_reply)

CODE_REPLY = "Here it is:\n```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    pass\n```\n"
MESSAGES = [Message(role="system", content="rules"), Message(role="user", content="write a kernel")]
FAST = {"backoff_s": 0.01, "backoff_max_s": 0.02, "max_attempts": 3}


class Sleeps:
    """Records the waits the retry policy asks for, and really sleeps them."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        time.sleep(seconds)


@pytest.fixture
def server():
    with ScriptedServer() as s:
        yield s


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN",
                "ANTHROPIC_BASE_URL", "CRUCIBLE_MODEL", "CRUCIBLE_PRICES"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.fixture
def openai_env(clean_env, server):
    clean_env.setenv("OPENAI_API_KEY", "sk-test")
    clean_env.setenv("OPENAI_BASE_URL", server.url + "/v1")
    return clean_env


@pytest.fixture
def anthropic_env(clean_env, server):
    clean_env.setenv("ANTHROPIC_API_KEY", "ak-test")
    clean_env.setenv("ANTHROPIC_BASE_URL", server.url)
    return clean_env


def ask(provider, max_tokens: int = 256, temperature: float = 0.5) -> Reply:
    return provider.complete(MESSAGES, max_tokens=max_tokens, temperature=temperature)


# ---- OpenAI Chat Completions ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_openai_reply_usage_and_cost(openai_env, server, stream):
    server.add(sse_reply(openai_stream(["Here it is:\n```python\n", "import torch\n", "```\n"]))
               if stream else json_reply(openai_completion(CODE_REPLY)))
    provider = make_provider("openai:gpt-test", prices={"openai:gpt-test": {"input": 2.0, "output": 10.0}},
                             stream=stream, **FAST)
    reply = ask(provider)
    assert provider.name == "openai:gpt-test"
    assert reply.text == ("Here it is:\n```python\nimport torch\n```\n" if stream else CODE_REPLY)
    assert (reply.model, reply.provider, reply.attempts, reply.finish_reason) == (
        "served-model", "openai:gpt-test", 1, "stop")
    assert reply.usage == Usage(input_tokens=11, output_tokens=7)
    assert reply.cost_usd == pytest.approx((11 * 2.0 + 7 * 10.0) / 1e6)
    [req] = server.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-test"  # the key came from OPENAI_API_KEY
    assert req.body["model"] == "gpt-test" and req.body["max_tokens"] == 256 and req.body["temperature"] == 0.5
    assert req.body["messages"] == [{"role": "system", "content": "rules"}, {"role": "user", "content": "write a kernel"}]
    assert req.body.get("stream", False) is stream
    if stream:
        assert req.body["stream_options"] == {"include_usage": True}


def test_openai_429_honours_retry_after(openai_env, server):
    server.add(json_reply({"error": {"message": "slow down"}}, status=429, **{"Retry-After": "1"}),
               json_reply({"error": {"message": "slow down"}}, status=429, **{"retry-after-ms": "150"}),
               json_reply(openai_completion(CODE_REPLY)))
    sleeps = Sleeps()
    reply = ask(make_provider("openai:m", sleep=sleeps, backoff_s=5.0, max_attempts=4))
    assert reply.attempts == 3 and reply.text == CODE_REPLY
    assert sleeps.waits == [pytest.approx(1.0), pytest.approx(0.15)]  # the server's hints, not the 5 s backoff
    gaps = [b.at - a.at for a, b in zip(server.requests, server.requests[1:])]
    assert gaps[0] >= 0.95 and gaps[1] >= 0.14
    assert reply.latency_s >= 1.1


def test_openai_retry_after_is_capped(openai_env, server):
    server.add(json_reply({"error": {"message": "later"}}, status=429, **{"Retry-After": "3600"}),
               json_reply(openai_completion("ok")))
    sleeps = Sleeps()
    reply = ask(make_provider("openai:m", sleep=sleeps, retry_after_cap_s=0.05))
    assert reply.text == "ok" and sleeps.waits == [0.05]


def test_openai_5xx_then_success_backs_off(openai_env, server):
    server.add(json_reply({"error": {"message": "boom"}}, status=500),
               json_reply({"error": {"message": "unavailable"}}, status=503),
               json_reply(openai_completion("fine")))
    sleeps = Sleeps()
    reply = ask(make_provider("openai:m", sleep=sleeps, backoff_s=0.02, backoff_max_s=1.0, max_attempts=3))
    assert reply.attempts == 3 and reply.text == "fine" and len(server.requests) == 3
    # exponential with jitter in [0.5, 1] of 0.02 * 2**(n-1)
    assert 0.01 <= sleeps.waits[0] <= 0.02 and 0.02 <= sleeps.waits[1] <= 0.04


@pytest.mark.parametrize("bad", [
    raw_reply("{not json"),
    json_reply({"id": "x", "object": "chat.completion", "model": "m"}),  # no choices
    json_reply({"id": "x", "object": "chat.completion", "model": "m", "choices": []}),
    sse_reply(openai_stream(["```python\nimport tor"], finish=None, usage=None, done=False)),  # stream cut short
    sse_reply(["data: {broken\n\n"]),
], ids=["invalid-json", "no-choices", "empty-choices", "cut-stream", "bad-sse-json"])
def test_openai_malformed_reply_is_retried(openai_env, server, bad):
    stream = bad.sse is not None
    good = sse_reply(openai_stream(["fine"])) if stream else json_reply(openai_completion("fine"))
    server.add(bad, good)
    reply = ask(make_provider("openai:m", stream=stream, **FAST))
    assert reply.text == "fine" and reply.attempts == 2


def test_openai_malformed_every_time_is_one_sentence(openai_env, server):
    server.add(*[raw_reply("<html>proxy error</html>")] * 3)
    with pytest.raises(ProviderError) as err:
        ask(make_provider("openai:m", **FAST))
    assert "malformed" in str(err.value) and "after 3 attempts" in str(err.value) and err.value.transient
    assert "\n" not in str(err.value)


def test_openai_rate_limit_exhausted(openai_env, server):
    server.add(*[json_reply({"error": {"message": "quota"}}, status=429, **{"Retry-After": "0"})] * 3)
    with pytest.raises(ProviderError) as err:
        ask(make_provider("openai:m", **FAST))
    assert "429" in str(err.value) and "after 3 attempts" in str(err.value) and err.value.transient


@pytest.mark.parametrize("content", ["", None], ids=["empty-string", "null"])
def test_openai_empty_reply_is_a_reply_without_code(openai_env, server, content):
    server.add(json_reply(openai_completion(content, completion_tokens=0)))
    reply = ask(make_provider("openai:m", **FAST))
    assert reply.text == "" and reply.attempts == 1
    assert extract_code(reply.text) == NoCode("the reply was empty")


def test_openai_reply_without_code_is_recorded_not_raised(openai_env, server):
    server.add(json_reply(openai_completion("I cannot write this kernel, sorry.")))
    result = extract_code(ask(make_provider("openai:m", **FAST)).text)
    assert isinstance(result, NoCode) and "no Python code" in result.reason


def test_openai_timeout(openai_env, server):
    server.add(json_reply(openai_completion("late"), status=200), json_reply(openai_completion("late")))
    for action in server.script:
        action.delay_s = 1.0
    start = time.monotonic()
    with pytest.raises(ProviderError) as err:
        ask(make_provider("openai:m", timeout_s=0.25, max_attempts=2, backoff_s=0.01, backoff_max_s=0.01))
    assert "did not answer" in str(err.value) and "0.25s" in str(err.value) and err.value.transient
    assert time.monotonic() - start < 1.5 and len(server.requests) == 2


def test_openai_dropped_connection_is_retried(openai_env, server):
    from tests.llm_server import Action

    server.add(Action(drop=True), json_reply(openai_completion("back")))
    reply = ask(make_provider("openai:m", **FAST))
    assert reply.text == "back" and reply.attempts == 2


def test_openai_auth_error_is_not_retried(openai_env, server):
    server.add(json_reply({"error": {"message": "Incorrect API key provided"}}, status=401))
    with pytest.raises(ProviderError) as err:
        ask(make_provider("openai:m", **FAST))
    assert "OPENAI_API_KEY" in str(err.value) and not err.value.transient and len(server.requests) == 1


def test_openai_unknown_model_404(openai_env, server):
    server.add(json_reply({"error": {"message": "The model `nope` does not exist"}}, status=404))
    with pytest.raises(ProviderError, match="does not know model 'nope'"):
        ask(make_provider("openai:nope", **FAST))


def test_openai_switches_to_max_completion_tokens_when_refused(openai_env, server):
    refusal = {"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                                    "'max_completion_tokens' instead.", "type": "invalid_request_error",
                         "param": "max_tokens", "code": "unsupported_parameter"}}
    server.add(json_reply(refusal, status=400), json_reply(openai_completion("ok")))
    provider = make_provider("openai:reasoner", **FAST)
    assert ask(provider).text == "ok"
    assert "max_tokens" in server.requests[0].body
    assert server.requests[1].body["max_completion_tokens"] == 256 and "max_tokens" not in server.requests[1].body


def test_openai_compatible_server_without_key(clean_env, server):
    clean_env.setenv("OPENAI_BASE_URL", server.url + "/v1")  # e.g. a local vLLM or Ollama: no key needed
    server.add(json_reply(openai_completion("local")))
    assert ask(make_provider("openai:qwen:7b", **FAST)).text == "local"
    assert server.requests[0].body["model"] == "qwen:7b"  # Ollama-style names keep their colon


def test_openai_missing_key(clean_env):
    with pytest.raises(ProviderError) as err:
        make_provider("openai:gpt-test")
    assert "OPENAI_API_KEY" in str(err.value) and not err.value.transient


@pytest.mark.parametrize("stream", [False, True])
def test_openai_unreachable_endpoint(clean_env, stream):
    clean_env.setenv("OPENAI_API_KEY", "sk-test")
    clean_env.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{closed_port()}/v1")
    with pytest.raises(ProviderError) as err:
        ask(make_provider("openai:m", stream=stream, **FAST))
    text = str(err.value)
    assert text.startswith("could not reach http://127.0.0.1:") and "OPENAI_BASE_URL" in text
    assert "after 3 attempts" in text and err.value.transient


# ---- Anthropic Messages ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_reply_usage_and_cost(anthropic_env, server, stream):
    server.add(sse_reply(anthropic_stream(["Here", " it is"])) if stream else json_reply(anthropic_message("Here it is")))
    provider = make_provider("anthropic:claude-test", prices={"claude-test": {"input": 3, "output": 15}},
                             stream=stream, **FAST)
    reply = ask(provider, max_tokens=300, temperature=0.2)
    assert (reply.text, reply.model, reply.provider, reply.attempts) == (
        "Here it is", "served-claude", "anthropic:claude-test", 1)
    assert reply.usage == Usage(input_tokens=13, output_tokens=5) and reply.finish_reason == "end_turn"
    assert reply.cost_usd == pytest.approx((13 * 3 + 5 * 15) / 1e6)
    [req] = server.requests
    assert req.path == "/v1/messages" and "anthropic-version" in req.headers
    # the key came from ANTHROPIC_API_KEY (SDK versions differ in the header they put it in)
    assert req.headers.get("x-api-key") == "ak-test" or req.headers.get("authorization") == "Bearer ak-test"
    assert req.body["system"] == "rules"  # system messages go to the system parameter
    assert req.body["messages"] == [{"role": "user", "content": "write a kernel"}]
    assert req.body["max_tokens"] == 300 and req.body["temperature"] == 0.2


def test_anthropic_overloaded_and_rate_limited_then_success(anthropic_env, server):
    server.add(json_reply({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, status=529),
               json_reply({"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}, status=429,
                          **{"retry-after": "0.2"}),
               json_reply(anthropic_message("done")))
    sleeps = Sleeps()
    reply = ask(make_provider("anthropic:c", sleep=sleeps, backoff_s=0.01, backoff_max_s=0.01, max_attempts=3))
    assert reply.text == "done" and reply.attempts == 3
    assert sleeps.waits[1] == pytest.approx(0.2) and sleeps.waits[0] <= 0.01


def test_anthropic_error_event_inside_stream_is_retried(anthropic_env, server):
    server.add(sse_reply(anthropic_stream(["par"], error={"type": "overloaded_error", "message": "Overloaded"})),
               sse_reply(anthropic_stream(["whole"])))
    reply = ask(make_provider("anthropic:c", stream=True, **FAST))
    assert reply.text == "whole" and reply.attempts == 2


def test_anthropic_stream_cut_before_stop_is_retried(anthropic_env, server):
    server.add(sse_reply(anthropic_stream(["half"], stop=False)), sse_reply(anthropic_stream(["whole"])))
    reply = ask(make_provider("anthropic:c", stream=True, **FAST))
    assert reply.text == "whole" and reply.attempts == 2


def test_anthropic_merges_consecutive_turns(anthropic_env, server):
    server.add(json_reply(anthropic_message("ok")))
    make_provider("anthropic:c", **FAST).complete(
        [Message(role="system", content="a"), Message(role="system", content="b"),
         Message(role="user", content="u1"), Message(role="user", content="u2")], max_tokens=10, temperature=0)
    body = server.requests[0].body
    assert body["system"] == "a\n\nb" and body["messages"] == [{"role": "user", "content": "u1\n\nu2"}]


def test_anthropic_missing_key(clean_env):
    with pytest.raises(ProviderError, match="ANTHROPIC_API_KEY"):
        make_provider("anthropic:claude-test")


def test_anthropic_unreachable_endpoint(clean_env):
    clean_env.setenv("ANTHROPIC_API_KEY", "ak")
    clean_env.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(ProviderError, match=r"^could not reach .*ANTHROPIC_BASE_URL"):
        ask(make_provider("anthropic:c", **FAST))


# ---- choosing a provider, prices ------------------------------------------------------------------------------------
def test_no_model_means_the_tuner(clean_env):
    assert make_provider(None) is None
    assert make_provider("tuner") is None


def test_model_from_environment(openai_env, server):
    openai_env.setenv("CRUCIBLE_MODEL", "openai:from-env")
    server.add(json_reply(openai_completion("x")))
    provider = make_provider(None, **FAST)
    assert provider.name == "openai:from-env" and ask(provider).provider == "openai:from-env"


@pytest.mark.parametrize("spec, needle", [
    ("mistral:large", "unknown provider 'mistral'"),
    ("gpt-4o", "is not PROVIDER:MODEL"),
    ("openai:", "is not PROVIDER:MODEL"),
])
def test_bad_spec_is_one_sentence(clean_env, spec, needle):
    with pytest.raises(ProviderError) as err:
        make_provider(spec)
    assert needle in str(err.value) and "openai:NAME" in str(err.value) and "\n" not in str(err.value)


def test_prices_from_file_and_env_and_unknown_price(openai_env, server, tmp_path):
    table = tmp_path / "prices.json"
    table.write_text(json.dumps({"openai:priced": {"input": 1.0, "output": 4.0}}))
    openai_env.setenv("CRUCIBLE_PRICES", str(table))
    server.add(json_reply(openai_completion("a", prompt_tokens=1000, completion_tokens=500)),
               json_reply(openai_completion("b")))
    assert ask(make_provider("openai:priced", **FAST)).cost_usd == pytest.approx((1000 * 1.0 + 500 * 4.0) / 1e6)
    assert ask(make_provider("openai:unpriced", **FAST)).cost_usd is None  # never guessed
    openai_env.setenv("CRUCIBLE_PRICES", '{"m": {"input": 0.5, "output": 1}}')
    assert load_prices() == {"m": Price(input=0.5, output=1.0)}


@pytest.mark.parametrize("value, needle", [
    ("/nonexistent/prices.json", "neither JSON nor an existing file"),
    ("{oops", "not valid JSON"),
    ('{"m": {"input": -1, "output": 1}}', "non-negative"),
    ('{"m": {"in": 1, "out": 1}}', "must be"),
])
def test_bad_price_table(clean_env, value, needle):
    clean_env.setenv("CRUCIBLE_PRICES", value)
    with pytest.raises(ProviderError, match=needle):
        load_prices()


def test_missing_usage_gives_no_cost(openai_env, server):
    body = openai_completion("x")
    del body["usage"]
    server.add(json_reply(body))
    reply = ask(make_provider("openai:m", prices={"m": {"input": 1, "output": 1}}, **FAST))
    assert reply.usage == Usage() and reply.cost_usd is None


# ---- the fake provider ----------------------------------------------------------------------------------------------
def test_fake_replays_in_order_and_records_prompts():
    fake = FakeProvider(price=Price(input=1, output=2))
    fake.enqueue(CODE_REPLY, usage=Usage(input_tokens=10, output_tokens=20))
    fake.enqueue_error(ProviderError("rate limited", transient=True)).enqueue("second")
    first = fake.complete(MESSAGES, max_tokens=5, temperature=0.1)
    assert isinstance(extract_code(first.text), ExtractedCode) and first.cost_usd == pytest.approx(50 / 1e6)
    with pytest.raises(ProviderError, match="rate limited"):
        fake.complete([Message(role="user", content="again")], max_tokens=5, temperature=0.1)
    assert fake.complete(MESSAGES, max_tokens=7, temperature=0.0).text == "second"
    assert len(fake.calls) == 3 and fake.calls[1].messages[0].content == "again" and fake.calls[2].max_tokens == 7
    assert "[user]\nwrite a kernel" in fake.prompts[0]
    with pytest.raises(ProviderError, match="no queued reply left"):
        fake.complete(MESSAGES, max_tokens=5, temperature=0.1)


def test_fake_is_thread_safe_and_can_be_slow():
    fake = FakeProvider(default="default reply")
    for i in range(8):
        fake.enqueue(f"r{i}", delay_s=0.05)
    texts: list[str] = []

    def worker():
        texts.append(fake.complete(MESSAGES, max_tokens=1, temperature=0).text)

    threads = [threading.Thread(target=worker) for _ in range(10)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(texts) == sorted([f"r{i}" for i in range(8)] + ["default reply"] * 2)
    assert time.monotonic() - start < 0.3 and fake.pending == 0 and len(fake.calls) == 10


def test_anthropic_stops_sending_temperature_when_the_model_refuses_it(anthropic_env, server):
    refusal = {"type": "error", "error": {"type": "invalid_request_error",
                                          "message": "temperature is not supported for this model"}}
    server.add(json_reply(refusal, status=400), json_reply(anthropic_message("ok")), json_reply(anthropic_message("2")))
    provider = make_provider("anthropic:c", **FAST)
    assert ask(provider).text == "ok" and ask(provider).text == "2"
    assert "temperature" in server.requests[0].body
    assert all("temperature" not in r.body for r in server.requests[1:])  # remembered for later calls


def test_other_bad_requests_fail_at_once_with_the_servers_reason(openai_env, server):
    server.add(json_reply({"error": {"message": "This model's maximum context length is 8192 tokens."}}, status=400))
    with pytest.raises(ProviderError) as err:
        ask(make_provider("openai:m", **FAST))
    assert "maximum context length is 8192" in str(err.value) and "HTTP 400" in str(err.value)
    assert not err.value.transient and len(server.requests) == 1
