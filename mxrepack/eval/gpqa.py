"""A GPQA-style multiple-choice harness with the sampling, prompt and grading of ``gpt_oss.evals``.

Backends: any OpenAI-compatible server (``/v1/chat/completions``: the user's vLLM or SGLang serving a
repacked checkpoint) or a checkpoint run in this process. Requests run ``concurrency`` at a time;
network failures, timeouts, HTTP 429/5xx and empty answers are retried with exponential backoff
(``backoff * 2**attempt`` seconds, as gpt_oss' sampler does).

A request that fails (HTTP 400, or no answer after the retries) is an error, not a wrong answer:
gpt_oss' sampler grades HTTP 400 as the answer "No response (bad request).", so a server that refused
every request (vLLM rendering gpt-oss chats with Harmony token ids outside a small model's vocabulary)
scored 0.0 and passed for a run. Here errors are counted apart, with the server's message, and the
score is over the answered requests. More errors than ``max_errors`` allows (a count, or a percentage
of the requests: 5% by default) mark the result ``too_many_errors``; the run then stops sending
requests, the command exits 1 and the regression gate refuses the result.

Result JSON: ``score`` (mean over answered samples; null when none was answered), ``stderr`` (sample
standard deviation / sqrt(n)), ``std``, ``n_samples`` (answered), ``n_requests``, ``errors``,
``not_asked``, ``max_errors``, ``too_many_errors``, ``first_error``, and ``samples`` with each
``prompt``, ``response``, ``extracted`` letter, ``answer`` letter, ``correct`` and ``error`` (null, or
the failure; then ``response`` and ``correct`` are null); plus timing (``requests_per_s``) and what was run.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Protocol

from mxrepack.errors import MxRepackError
from mxrepack.eval.gpqa_format import build_samples, extract_letter, read_rows

DEFAULT_MAX_ERRORS = "5%"
SCORED_OVER = "answered requests; a failed request is an error (counted in errors), not a wrong answer"


class RequestFailed(MxRepackError):
    """One request failed: the server refused it (HTTP 400) or gave no answer after the retries."""


def _server_message(e: urllib.error.HTTPError) -> str:
    """The error message in an HTTP error's body, on one line (OpenAI's and vLLM's ``{"error": {"message"}}``,
    vLLM's older ``{"message"}``, FastAPI's ``{"detail"}``, or the raw text)."""
    try:
        raw = e.read().decode("utf-8", "replace")
    except Exception:  # a body that cannot be read still leaves the status line
        raw = ""
    text = raw
    try:
        body = json.loads(raw)
        if isinstance(body, dict):
            err = body.get("error")
            found = err.get("message") if isinstance(err, dict) else err
            text = str(found or body.get("message") or body.get("detail") or raw)
    except json.JSONDecodeError:
        pass
    text = " ".join(text.split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return text or str(e.reason)


class ChatBackend(Protocol):
    name: str

    def complete(self, messages: list[dict]) -> str: ...


class OpenAIChatBackend:
    """Chat completions over HTTP with retries (stdlib only: no client library to pin)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float = 1.0,
        max_tokens: int | None = None,
        reasoning_effort: str | None = None,
        timeout: float = 600.0,
        retries: int = 5,
        backoff: float = 1.0,
    ):
        self.base_url = _check_base_url(base_url)
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
                message = _server_message(e)
                if e.code == 400:  # this request is refused; retrying it would not change that
                    raise RequestFailed(f"{self.url}: HTTP 400: {message}") from None
                last = f"HTTP {e.code}: {message}"
                if e.code not in (408, 409, 429) and e.code < 500:  # the URL, model or key: every request would fail
                    raise MxRepackError(
                        f"{self.url}: HTTP {e.code}: {message}; check --base-url, --model and --api-key"
                    ) from None
            except (
                urllib.error.URLError,
                ConnectionError,
                socket.timeout,
                TimeoutError,
                json.JSONDecodeError,
                http_client_errors(),
            ) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            if attempt < self.retries:
                time.sleep(self.backoff * 2**attempt)
        raise RequestFailed(f"{self.url}: no answer after {self.retries + 1} attempts (last: {last})")

    def check_reachable(self) -> None:
        """Refuse, before the run, a server that nothing answers for: each request waited out its retries (31 s
        with the defaults) and the run ended as "4 of 4 requests failed", with a result file of no answers. Only
        a connection is tried (no request, so no key or model is needed); through a proxy nothing is tried."""
        parts = urllib.parse.urlsplit(self.url)
        if urllib.request.getproxies().get(parts.scheme) and not urllib.request.proxy_bypass(parts.hostname):
            return
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # an IPv6 literal, as in a URL
        try:
            socket.create_connection((parts.hostname, port), timeout=min(self.timeout, 10)).close()
        except socket.gaierror as e:
            raise MxRepackError(
                f"--base-url {self.base_url}: no such host {parts.hostname} ({e.strerror or e}); check the URL"
            ) from None
        except OSError as e:
            reason = e.strerror or str(e) or type(e).__name__
            raise MxRepackError(
                f"--base-url {self.base_url}: nothing answers at {host}:{port} ({reason}); start the server or check "
                "the URL"
            ) from None


def _check_base_url(base_url: str) -> str:
    """An http(s) URL with a host: an empty one or one without its scheme was a ValueError traceback or
    "unknown url type" for every request."""
    try:
        parts = urllib.parse.urlsplit(base_url)
        _ = parts.port  # a port that is no number raises only when read
    except ValueError as e:
        raise MxRepackError(f"--base-url {base_url!r}: {e}; expected a URL like http://localhost:8000/v1") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MxRepackError(
            f"--base-url {base_url!r}: expected an http:// or https:// URL like http://localhost:8000/v1"
        )
    return base_url


def check_options(
    concurrency: int = 1,
    temperature: float | None = None,
    max_tokens: int | None = None,
    timeout: float | None = None,
    retries: int | None = None,
) -> None:
    """One line for a flag out of range, before a model loads or a request is sent: --concurrency 0 ran as 1
    and was recorded as 0, --max-tokens 0 meant the default and a negative one empty answers graded wrong,
    --retries -1 sent nothing, --timeout 0 failed every connection, a negative or NaN temperature failed every
    request at the server."""
    if concurrency < 1:
        raise MxRepackError(f"--concurrency {concurrency}: expected 1 or more")
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        raise MxRepackError(f"--temperature {temperature}: expected a finite number, 0 (greedy) or more")
    if max_tokens is not None and max_tokens < 1:
        raise MxRepackError(f"--max-tokens {max_tokens}: expected 1 or more")
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise MxRepackError(f"--timeout {timeout}: expected a number of seconds above 0")
    if retries is not None and retries < 0:
        raise MxRepackError(f"--retries {retries}: expected 0 or more")


def http_client_errors() -> type:
    import http.client

    return http.client.HTTPException


class LocalBackend:
    """A checkpoint run in this process through mxrepack.eval.model (greedy unless temperature > 0)."""

    def __init__(
        self,
        path: str | Path | None = None,
        temperature: float = 0.0,
        max_tokens: int | None = None,
        model=None,
        **runner_kwargs,
    ):
        from mxrepack.eval.local import LocalChatModel

        self.model = model or LocalChatModel(path, **runner_kwargs)
        # the limit it runs with, recorded as such: None and the runner's default are one setting to `eval compare`
        self.temperature, self.max_tokens = temperature, max_tokens or self.model.max_new_tokens
        self.name = f"local {self.model.path}"
        from mxrepack.serve.spec import weights_identity

        self.weights = weights_identity(self.model.path)

    def complete(self, messages: list[dict]) -> str:
        return self.model.complete(messages, self.temperature, self.max_tokens)[0]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def allowed_errors(max_errors: str | int, requests: int) -> int:
    """How many failed requests ``max_errors`` allows: a count ("3") or a percentage of ``requests`` ("5%")."""
    text = str(max_errors).strip()
    m = re.fullmatch(r"(\d+(?:\.\d*)?)%|(\d+)", text)
    if not m:
        raise MxRepackError(f"--max-errors {text!r}: expected a count (3) or a percentage of the requests (5%)")
    if m[2] is not None:
        return int(m[2])
    if float(m[1]) > 100:
        raise MxRepackError(f"--max-errors {text!r}: expected a percentage of the requests up to 100%")
    return math.floor(requests * float(m[1]) / 100 + 1e-9)  # 5% of 200 is 10, not 9 by a rounding


def run_gpqa(
    backend: ChatBackend,
    data: str | Path,
    n_repeats: int = 1,
    num_examples: int | None = None,
    concurrency: int = 8,
    progress: Callable[[int, int], None] | None = None,
    max_errors: str | int = DEFAULT_MAX_ERRORS,
) -> dict:
    data = Path(data)
    check_options(concurrency)
    rows, digest = read_rows(data), _sha256(data)  # before the run: the file may change during it
    samples = build_samples(rows, n_repeats, num_examples)
    allowed = allowed_errors(max_errors, len(samples))
    started = time.perf_counter()
    done = errors = 0
    lock = threading.Lock()
    stop = threading.Event()  # set once the result cannot be used: the requests not yet sent are skipped

    def ask(sample):
        nonlocal done, errors
        if stop.is_set():
            return None
        record = {"index": sample.index, "row": sample.row, "prompt": sample.prompt, "answer": sample.answer}
        try:
            response = backend.complete([{"role": "user", "content": sample.prompt}])
        except RequestFailed as e:
            record.update(response=None, extracted=None, correct=None, error=str(e))
            with lock:
                errors += 1
                if errors > allowed:
                    stop.set()
        except BaseException:  # a wrong URL, model or key fails every request alike: stop sending them
            stop.set()
            raise
        else:
            extracted = extract_letter(response)
            record.update(response=response, extracted=extracted, correct=extracted == sample.answer, error=None)
        with lock:
            done += 1
            if progress:
                progress(done, len(samples))
        return record

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = [r for r in pool.map(ask, samples) if r is not None]
    elapsed = time.perf_counter() - started
    failed = [r for r in results if r["error"] is not None]
    scores = [float(r["correct"]) for r in results if r["error"] is None]
    n = len(scores)
    mean = sum(scores) / n if n else None
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / max(n - 1, 1)) if n else None
    return {
        "eval": "gpqa",
        "score": mean,
        "stderr": std / math.sqrt(n) if n else None,
        "std": std,
        "n_samples": n,
        "scored_over": SCORED_OVER,
        "n_requests": len(samples),
        "errors": len(failed),
        "not_asked": len(samples) - len(results),
        "max_errors": allowed,
        "max_errors_option": str(max_errors),
        "too_many_errors": len(failed) > allowed or n == 0,
        "first_error": failed[0]["error"] if failed else None,
        "n_repeats": n_repeats,
        "data": {
            "path": str(data),
            "sha256": digest,
            "rows": len(rows),
            "num_examples": num_examples,
        },
        # how the answers were drawn: `eval compare` refuses two runs that differ here (None: the default of the
        # server, or of the local runner)
        "sampling": {k: getattr(backend, k, None) for k in ("temperature", "max_tokens", "reasoning_effort")},
        "backend": backend.name,
        # the weights a local run read (the manifest's digest): `repack push --eval` checks it is the output's
        "weights": getattr(backend, "weights", None),
        "concurrency": concurrency,
        "seconds": round(elapsed, 3),
        "requests_per_s": round(len(results) / elapsed, 3) if elapsed > 0 else None,
        "samples": results,
    }


def require_score(r: dict, name: str) -> None:
    """Refuse a result that is not a usable score: another command's result, no score/stderr, a score or stderr
    that is no number in range, or more failed requests than its run allowed."""
    if r.get("eval", "gpqa") != "gpqa":  # a logits result was "has no score/stderr"
        raise MxRepackError(f"{name}: a `repack eval {r['eval']}` result; expected `repack eval gpqa` output")
    if "score" not in r or "stderr" not in r:
        raise MxRepackError(f"{name} has no score/stderr; expected `repack eval gpqa` output")
    if r.get("too_many_errors") or r["score"] is None:
        if not r.get("errors"):  # nothing failed and nothing was answered: "0 of 0 requests failed"
            raise MxRepackError(f"{name}: no answered samples; not a score to gate on")
        raise MxRepackError(
            f"{name}: {r.get('errors')} of {r.get('n_requests')} requests failed (more than its "
            f"--max-errors allowed: {r.get('max_errors')}); not a score to gate on "
            f"(first: {r.get('first_error')})"
        )
    for key in ("score", "stderr"):  # a string was a traceback; NaN failed the gate, an infinite stderr passed it
        v = r[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise MxRepackError(f"{name}: {key} {v!r}; expected a number from 0 to 1, as `repack eval gpqa` writes")


# What a backend runs with when the flag is not given, for the message that names a difference.
SAMPLING_DEFAULTS = {
    "temperature": "--local's default is 0 (greedy), --base-url's 1.0",
    "max_tokens": "--local's default is the runner's 64, --base-url's the server's",
    "reasoning_effort": "--local has none, --base-url's default is the server's",
}


def comparable(base: dict, cand: dict, names: tuple[str, str] = ("baseline JSON", "candidate JSON")) -> None:
    """Refuse two results that no gate can compare: scored on other questions (another question file, by its sha256,
    or another ``--num-examples`` subset of it), or drawn another way (temperature, max tokens, reasoning effort: a
    greedy baseline against a sampled candidate, or one at low effort against one at high, differ by more than their
    weights). Another ``--n-repeats`` is no difference: each run's stderr says how precise it is. What a result does
    not record (written before it did) is not checked."""
    b, c = base.get("data") or {}, cand.get("data") or {}

    def scored(d: dict) -> str:
        subset = f", --num-examples {d['num_examples']}" if d.get("num_examples") else ""
        return f"{d.get('path')} (sha256 {str(d.get('sha256'))[:12]}{subset})"

    for key, what in (("sha256", "question file"), ("num_examples", "--num-examples subset")):
        if key in b and key in c and b[key] != c[key]:
            raise MxRepackError(
                f"{names[1]}: scored {scored(c)}, where {names[0]} scored {scored(b)}; expected the same {what}"
            )
    bs, cs = base.get("sampling") or {}, cand.get("sampling") or {}
    for key, defaults in SAMPLING_DEFAULTS.items():
        if key in bs and key in cs and bs[key] != cs[key]:
            flag = "--" + key.replace("_", "-")
            said = {v: f"no {flag}" if v is None else f"{flag} {v}" for v in (bs[key], cs[key])}
            raise MxRepackError(
                f"{names[1]}: ran with {said[cs[key]]}, where {names[0]} ran with {said[bs[key]]}; expected the "
                f"same {flag} ({defaults}): run both the same way"
            )


def compare(
    base: dict,
    cand: dict,
    z: float = 1.96,
    tolerance: float = 0.0,
    names: tuple[str, str] = ("baseline JSON", "candidate JSON"),
) -> dict:
    """The regression gate: the candidate fails when its score is below the baseline's by more than
    ``tolerance + z * sqrt(stderr_base**2 + stderr_cand**2)``, i.e. by more than chance explains (a
    one-sided test at ~97.5% with z = 1.96) plus an optional absolute tolerance (vLLM CI uses 0.05
    alone). A better candidate always passes. Two runs that cannot be compared are refused (:func:`comparable`;
    ``names``: how the message calls the two results, their files where the CLI has them)."""
    if tolerance < 0 or z < 0:  # a negative margin would fail a candidate that scored higher
        raise MxRepackError(f"--tolerance {tolerance} / --z {z}: expected 0 or more")
    if not (math.isfinite(tolerance) and math.isfinite(z)):  # NaN failed every candidate; inf passed every one
        raise MxRepackError(f"--tolerance {tolerance} / --z {z}: expected finite numbers")
    for name, r in zip(names, (base, cand)):
        require_score(r, name)
    comparable(base, cand, names)
    se = math.sqrt(base["stderr"] ** 2 + cand["stderr"] ** 2)
    drop = base["score"] - cand["score"]
    allowed = tolerance + z * se
    return {
        "baseline": base["score"],
        "candidate": cand["score"],
        "delta": -drop,
        "stderr_diff": se,
        "z": z,
        "tolerance": tolerance,
        "allowed_drop": allowed,
        "passed": drop <= allowed,
        "rule": "fail if baseline - candidate > tolerance + z * sqrt(se_b^2 + se_c^2)",
    }
