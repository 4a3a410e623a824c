"""A scripted HTTP server on 127.0.0.1 speaking the OpenAI Chat Completions and Anthropic Messages wire formats.

Each request takes the next scripted action; requests are recorded (path, headers, JSON body) so tests can check
what the real SDK clients sent. Used by tests/test_providers.py; no internet involved.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass
class Action:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    delay_s: float = 0.0  # sleep before answering (timeouts)
    sse: list[str] | None = None  # raw SSE frames, sent one by one, then the connection closes
    drop: bool = False  # close the connection without answering


def json_reply(body: Any, status: int = 200, **headers: str) -> Action:
    return Action(status=status, body=json.dumps(body).encode(), headers=dict(headers))


def raw_reply(body: bytes | str, status: int = 200, content_type: str = "application/json") -> Action:
    return Action(status=status, body=body.encode() if isinstance(body, str) else body, content_type=content_type)


def sse_reply(frames: list[str]) -> Action:
    return Action(sse=frames, content_type="text/event-stream")


# ---- the wire formats -----------------------------------------------------------------------------------------------
def openai_completion(text: str | None, *, model: str = "served-model", prompt_tokens: int = 11,
                      completion_tokens: int = 7, finish: str = "stop") -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def openai_stream(pieces: list[str], *, model: str = "served-model", usage: tuple[int, int] | None = (11, 7),
                  finish: str | None = "stop", done: bool = True) -> list[str]:
    def frame(obj: dict) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model}
    frames = [frame({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                          "finish_reason": None}]})]
    frames += [frame({**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]})
               for p in pieces]
    if finish is not None:
        frames.append(frame({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
    if usage is not None:
        frames.append(frame({**base, "choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                                                              "total_tokens": sum(usage)}}))
    if done:
        frames.append("data: [DONE]\n\n")
    return frames


def anthropic_message(text: str, *, model: str = "served-claude", input_tokens: int = 13,
                      output_tokens: int = 5, stop: str = "end_turn") -> dict:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}], "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}


def anthropic_stream(pieces: list[str], *, model: str = "served-claude", usage: tuple[int, int] = (13, 5),
                     stop: bool = True, error: dict | None = None) -> list[str]:
    def frame(kind: str, obj: dict) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **obj})}\n\n"

    frames = [frame("message_start", {"message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                  "model": model, "content": [], "stop_reason": None,
                                                  "stop_sequence": None,
                                                  "usage": {"input_tokens": usage[0], "output_tokens": 1}}}),
              frame("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})]
    frames += [frame("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": p}}) for p in pieces]
    if error is not None:
        frames.append(frame("error", {"error": error}))
        return frames
    frames.append(frame("content_block_stop", {"index": 0}))
    frames.append(frame("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                          "usage": {"output_tokens": usage[1]}}))
    if stop:
        frames.append(frame("message_stop", {}))
    return frames


# ---- the server -----------------------------------------------------------------------------------------------------
@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict | None
    at: float


class ScriptedServer:
    """`responder`, when given, answers each request the script has no action left for: it gets the JSON body and
    returns an Action (a model that answers from what it is shown)."""

    def __init__(self, responder: Callable[[dict | None], Action] | None = None) -> None:
        self.responder = responder
        self.script: list[Action] = []
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    body = None
                with server._lock:
                    server.requests.append(Request(self.path, {k.lower(): v for k, v in self.headers.items()},
                                                   body, time.monotonic()))
                    action = server.script.pop(0) if server.script else None
                if action is None:
                    action = server.responder(body) if server.responder is not None else json_reply(
                        {"error": {"message": "the test server ran out of scripted replies"}}, status=418)
                server._answer(self, action)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01},
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, *actions: Action) -> "ScriptedServer":
        with self._lock:
            self.script.extend(actions)
        return self

    def _answer(self, handler: BaseHTTPRequestHandler, action: Action) -> None:
        if action.delay_s:
            time.sleep(action.delay_s)
        if action.drop:
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        handler.send_response(action.status)
        handler.send_header("Content-Type", action.content_type)
        for key, value in action.headers.items():
            handler.send_header(key, value)
        if action.sse is not None:
            handler.send_header("Cache-Control", "no-cache")
            handler.end_headers()
            for frame in action.sse:
                handler.wfile.write(frame.encode())
                handler.wfile.flush()
            handler.close_connection = True
            return
        handler.send_header("Content-Length", str(len(action.body)))
        handler.end_headers()
        handler.wfile.write(action.body)

    def __enter__(self) -> "ScriptedServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
