"""A checkpoint as a chat model in this process: tokenizer, chat template, generation.

The tokenizer is the checkpoint's ``tokenizer.json`` (the ``tokenizers`` library); the prompt is its
``chat_template.jinja`` (or ``tokenizer_config.json``'s ``chat_template``) rendered with jinja2;
generation stops at ``generation_config.json``'s ``eos_token_id``(s).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from mxrepack.errors import MxRepackError, require_folder
from mxrepack.eval.model import GptOssRunner, load_runner


def load_chat_template(path: Path):
    """The checkpoint's chat template, compiled (jinja2, sandboxed)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if (path / "chat_template.jinja").is_file():
        text = (path / "chat_template.jinja").read_text()
    else:
        cfg = path / "tokenizer_config.json"
        text = json.loads(cfg.read_text()).get("chat_template") if cfg.is_file() else None
        if not text:
            raise MxRepackError(f"{path}: no chat_template.jinja or tokenizer_config.json chat_template")
    return ImmutableSandboxedEnvironment().from_string(text)


class LocalChatModel:
    """``complete(messages) -> text``: greedy or sampled, one request at a time (a lock serializes)."""

    def __init__(self, path: str | Path, runner: GptOssRunner | None = None, max_new_tokens: int = 64, **runner_kwargs):
        from tokenizers import Tokenizer

        self.path = Path(path).absolute()  # recorded by `eval gpqa --local` (push --eval checks it)
        require_folder(self.path)
        if not (self.path / "tokenizer.json").is_file():
            raise MxRepackError(f"{self.path}: no tokenizer.json; the local backend needs the model's tokenizer")
        self.tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.template = load_chat_template(self.path)
        gen = self.path / "generation_config.json"
        eos = json.loads(gen.read_text()).get("eos_token_id", []) if gen.is_file() else []
        self.stop = set(eos if isinstance(eos, list) else [eos])
        self.runner = runner or load_runner(self.path, **runner_kwargs)
        self.max_new_tokens = max_new_tokens
        self._lock = threading.Lock()

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        text = self.template.render(messages=messages, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def complete(
        self, messages: list[dict], temperature: float = 0.0, max_tokens: int | None = None, seed: int = 0
    ) -> tuple[str, int, int]:
        """-> (text, prompt tokens, completion tokens)."""
        ids = self.prompt_ids(messages)
        with self._lock:
            out = self.runner.generate(ids, max_tokens or self.max_new_tokens, self.stop, temperature, seed)
        return self.tokenizer.decode(out, skip_special_tokens=True), len(ids), len(out)
