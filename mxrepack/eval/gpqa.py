"""A GPQA-style multiple-choice harness with the sampling, prompt and grading of ``gpt_oss.evals``.

Backends: any OpenAI-compatible server (``/v1/chat/completions``: the user's vLLM or SGLang serving a
repacked checkpoint) or a checkpoint run in this process. Requests run ``concurrency`` at a time;
network failures, timeouts, HTTP 429/5xx and empty answers are retried with exponential backoff
(``backoff * 2**attempt`` seconds, as gpt_oss' sampler does); HTTP 400 is answered with the text
"No response (bad request)." and graded (wrong), as gpt_oss' chat-completions sampler does.

Result JSON: ``score`` (mean over samples), ``stderr`` (sample standard deviation / sqrt(n)),
``std``, ``n_samples``, and ``samples`` with each ``prompt``, ``response``, ``extracted`` letter,
``answer`` letter and ``correct``; plus timing (``requests_per_s``) and what was run.
"""

from __future__ import annotations

import hashlib
import json
import math
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Protocol

from mxrepack.errors import MxRepackError
from mxrepack.eval.gpqa_format import build_samples, extract_letter, read_rows

BAD_REQUEST_TEXT = "No response (bad request)."


class ChatBackend(Protocol):
    name: str

    def complete(self, messages: list[dict]) -> str: ...


class OpenAIChatBackend:
    """Chat completions over HTTP with retries (stdlib only: no client library to pin)."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, temperature: float = 1.0,
                 max_tokens: int | None = None, reasoning_effort: str | None = None, timeout: float = 600.0,
                 retries: int = 5, backoff: float = 1.0):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key = model, api_key
        self.temperature, self.max_tokens, self.reasoning_effort = temperature, max_tokens, reasoning_effort
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.name = f"openai-compatible {base_url} model={model}"
        self.attempts = 0  # total HTTP attempts (for the report)

    def _body(self, messages: list[dict]) -> bytes:
        body = {"model": self.model, "messages": messages, "temperature": self.temperature}
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        if self.reasoning_effort:
            body["reasoning_effort"] = self.reasoning_effort
        return json.dumps(body).encode()

    def complete(self, messages: list[dict]) -> str:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.retries + 1):
            self.attempts += 1
            req = urllib.request.Request(self.url, data=self._body(messages), headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    data = json.loads(resp.read())
                content = (data.get("choices") or [{}])[0].get("message", {}).get("content")
                if content:
                    return content
                last = "empty content"
            except urllib.error.HTTPError as e:
                if e.code == 400:
                    return BAD_REQUEST_TEXT
                last = f"HTTP {e.code}"
                if e.code not in (408, 409, 429) and e.code < 500:
                    raise MxRepackError(f"{self.url}: HTTP {e.code} ({e.reason}); check --base-url and --model") from None
            except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError, json.JSONDecodeError,
                    http_client_errors()) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            if attempt < self.retries:
                time.sleep(self.backoff * 2 ** attempt)
        raise MxRepackError(f"{self.url}: no answer after {self.retries + 1} attempts (last: {last})")


def http_client_errors() -> type:
    import http.client

    return http.client.HTTPException


class LocalBackend:
    """A checkpoint run in this process through mxrepack.eval.model (greedy unless temperature > 0)."""

    def __init__(self, path: str | Path | None = None, temperature: float = 0.0, max_tokens: int | None = None,
                 model=None, **runner_kwargs):
        from mxrepack.eval.local import LocalChatModel

        self.model = model or LocalChatModel(path, **runner_kwargs)
        self.temperature, self.max_tokens = temperature, max_tokens
        self.name = f"local {self.model.path}"

    def complete(self, messages: list[dict]) -> str:
        return self.model.complete(messages, self.temperature, self.max_tokens)[0]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_gpqa(backend: ChatBackend, data: str | Path, n_repeats: int = 1, num_examples: int | None = None,
             concurrency: int = 8, progress: Callable[[int, int], None] | None = None) -> dict:
    data = Path(data)
    samples = build_samples(read_rows(data), n_repeats, num_examples)
    started = time.perf_counter()
    done = 0

    def ask(sample):
        nonlocal done
        response = backend.complete([{"role": "user", "content": sample.prompt}])
        extracted = extract_letter(response)
        done += 1
        if progress:
            progress(done, len(samples))
        return {"index": sample.index, "row": sample.row, "prompt": sample.prompt, "response": response,
                "extracted": extracted, "answer": sample.answer, "correct": extracted == sample.answer}

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = list(pool.map(ask, samples))
    elapsed = time.perf_counter() - started
    scores = [float(r["correct"]) for r in results]
    n = len(scores)
    mean = sum(scores) / n
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / max(n - 1, 1))
    return {"eval": "gpqa", "score": mean, "stderr": std / math.sqrt(n), "std": std, "n_samples": n,
            "n_repeats": n_repeats, "data": {"path": str(data), "sha256": _sha256(data), "rows": len(read_rows(data))},
            "backend": backend.name, "concurrency": concurrency, "seconds": round(elapsed, 3),
            "requests_per_s": round(n / elapsed, 3) if elapsed > 0 else None, "samples": results}


def compare(base: dict, cand: dict, z: float = 1.96, tolerance: float = 0.0) -> dict:
    """The regression gate: the candidate fails when its score is below the baseline's by more than
    ``tolerance + z * sqrt(stderr_base**2 + stderr_cand**2)``, i.e. by more than chance explains (a
    one-sided test at ~97.5% with z = 1.96) plus an optional absolute tolerance (vLLM CI uses 0.05
    alone). A better candidate always passes."""
    for name, r in (("baseline", base), ("candidate", cand)):
        if "score" not in r or "stderr" not in r:
            raise MxRepackError(f"{name} JSON has no score/stderr; expected `repack eval gpqa` output")
    se = math.sqrt(base["stderr"] ** 2 + cand["stderr"] ** 2)
    drop = base["score"] - cand["score"]
    allowed = tolerance + z * se
    return {"baseline": base["score"], "candidate": cand["score"], "delta": -drop, "stderr_diff": se, "z": z,
            "tolerance": tolerance, "allowed_drop": allowed, "passed": drop <= allowed,
            "rule": "fail if baseline - candidate > tolerance + z * sqrt(se_b^2 + se_c^2)"}
