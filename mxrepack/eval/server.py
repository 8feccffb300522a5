"""A minimal OpenAI-compatible server for a local checkpoint: ``POST /v1/chat/completions``, ``GET /v1/models``.

For the harness's tests (a real HTTP server on localhost) and for trying a repacked tiny model with
any OpenAI client: ``repack eval serve PATH --port 8000``. Requests are answered by
:class:`mxrepack.eval.local.LocalChatModel`; ``ThreadingHTTPServer`` accepts connections concurrently
and generation is serialized. ``fault`` injects failures for tests: ``{"error_every": n}`` answers every
n-th request with HTTP 500, ``{"bad_request_every": n}`` with HTTP 400 (a two-line message in vLLM's error
body, of the kind vLLM sends for a prompt with token ids outside the model's vocabulary),
``{"drop_every": n}`` closes every n-th connection without a response, ``{"delay": s}`` sleeps before
answering.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # A client that gave up (its timeout, an injected delay) leaves a broken pipe behind: no traceback on
        # stderr, where it landed in whatever command or test was running by then.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class ChatServer:
    def __init__(
        self, model, model_name: str = "local", host: str = "127.0.0.1", port: int = 0, fault: dict | None = None
    ):
        self.model, self.model_name, self.fault = model, model_name, dict(fault or {})
        self.count = 0
        self._count_lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.model_name, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length)
                with server._count_lock:
                    server.count += 1
                    n = server.count
                if server.fault.get("drop_every") and n % server.fault["drop_every"] == 0:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if server.fault.get("error_every") and n % server.fault["error_every"] == 0:
                    self._send(500, {"error": {"message": "injected failure"}})
                    return
                if server.fault.get("bad_request_every") and n % server.fault["bad_request_every"] == 0:
                    self._send(
                        400,
                        {
                            "error": {
                                "message": "Token id 200005 is out of vocabulary\n(injected)",
                                "type": "BadRequestError",
                                "param": None,
                                "code": 400,
                            }
                        },
                    )
                    return
                if server.fault.get("delay"):
                    time.sleep(server.fault["delay"])
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                try:
                    req = json.loads(raw)
                    messages = req["messages"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    self._send(400, {"error": {"message": "expected a JSON body with messages"}})
                    return
                text, p, c = server.model.complete(
                    messages,
                    float(req.get("temperature", 0.0) or 0.0),
                    req.get("max_tokens") or req.get("max_completion_tokens"),
                    int(req.get("seed", 0) or 0),
                )
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{n}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": server.model_name,
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                        ],
                        "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
                    },
                )

        self.httpd = _Server((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "ChatServer":
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
