"""Train the bundled tiny gpt-oss on the synthetic GPQA-format task and write it in the official format.

``python -m mxrepack.eval.train_tiny OUT [--steps N]`` (10-13 minutes on the 2-core dev VM, whose speed varies by ~25%).

The model is transformers' ``GptOssForCausalLM`` at toy size, with every architectural feature of
the real one (sinks, sliding/full alternation, YaRN RoPE, GQA, top-2 of 4 experts, clamped SwiGLU,
biases) and widths that are multiples of 32 but not of 128. Its tokenizer is byte-level with the
harmony-style special tokens; the chat template wraps a user message as gpt-oss does. The answer is
trained to restate the four options and then answer ``Answer: X`` (see ``response_text``).

The last part of training fake-quantizes the experts to MXFP4 (straight-through estimator), so
the checkpoint, whose experts are stored as MXFP4 like the official ones, keeps its accuracy.
Output: ``model.safetensors`` (experts MXFP4 blocks/scales, everything else BF16), ``config.json``,
``generation_config.json``, ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``,
``tasks/{train,test}.csv`` and ``tasks/text.txt`` (the token set for logits comparisons).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from mxrepack import gptoss
from mxrepack.eval import tinytask
from mxrepack.eval.gpqa_format import build_samples, extract_letter
from mxrepack.quant import dequantize_mxfp4, quantize_mxfp4

SPECIAL_TOKENS = ["<|endoftext|>", "<|start|>", "<|message|>", "<|end|>", "<|return|>", "<|channel|>"]
VOCAB = 288  # 256 bytes + specials, rounded up to a multiple of 32
CHAT_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant<|channel|>final<|message|>{% endif %}"
)


# The response restates the options, then answers: copying the four option lines trains the copying
# (induction) heads quickly, and the final letter is then a short look back over the model's own
# lines instead of a long jump into the prompt. The grader's ladder reads the "Answer: X" line.
def response_text(choices, letter: str) -> str:
    lines = "".join(f"({'ABCD'[i]}) {c}\n" for i, c in enumerate(choices))
    return f"{lines}Answer: {letter}"


MAX_NEW_TOKENS = 48
LR = 2e-3


def tiny_config() -> dict:
    return gptoss.hf_config(
        hidden=96,
        intermediate=160,
        layers=4,
        experts=4,
        experts_per_token=2,
        heads=4,
        kv_heads=2,
        head_dim=32,
        sliding_window=128,
        max_positions=4096,
        context=256,
        vocab=VOCAB,
        bos_token_id=256,
        eos_token_id=260,
        pad_token_id=256,
        rope_factor=16.0,
        torch_dtype="bfloat16",
        quantization_config=dict(gptoss.NATIVE_QUANTIZATION_CONFIG),
    )


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (what a byte-level BPE vocabulary uses)."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in byte_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def _fake_quant_mxfp4(w: torch.Tensor) -> torch.Tensor:
    """MXFP4 round trip along the last dimension, straight-through in the backward pass."""
    packed, scales = quantize_mxfp4(w.detach().float())
    q = dequantize_mxfp4(packed, scales, torch.float32)
    return w + (q - w).detach()


class _ExpertsFakeQuant(torch.nn.Module):
    """Parametrization: transformers holds experts as [E, in, out]; MX groups run along ``in``."""

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return _fake_quant_mxfp4(w.transpose(1, 2)).transpose(1, 2)


def _encode_batch(tok, texts: list[str], targets: list[str], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids, labels = [], []
    for text, target in zip(texts, targets):
        a = tok.encode(text).ids
        b = tok.encode(target).ids
        ids.append(a + b)
        labels.append([-100] * len(a) + b)
    n = max(map(len, ids))
    x = torch.full((len(ids), n), pad)
    y = torch.full((len(ids), n), -100)
    prompt = torch.zeros((len(ids), n), dtype=torch.bool)
    for i, (a, b) in enumerate(zip(ids, labels)):
        x[i, : len(a)] = torch.tensor(a)
        y[i, : len(b)] = torch.tensor(b)
        prompt[i, : len(a) - sum(t != -100 for t in b)] = True
    return x, y, prompt


def chat_prompt(user: str) -> str:
    return f"<|start|>user<|message|>{user}<|end|><|start|>assistant<|channel|>final<|message|>"


def greedy_accuracy(path: Path, rows: list[dict], limit: int = 200) -> float:
    """Greedy GPQA-style accuracy of the exported checkpoint, run by mxrepack's runner (its logits
    equal transformers'; it has a KV cache, which transformers' eager generate loop here would not use)."""
    from mxrepack.eval.local import LocalChatModel

    model = LocalChatModel(path, max_new_tokens=MAX_NEW_TOKENS)
    samples = build_samples(rows)[:limit]
    hits = sum(extract_letter(model.complete([{"role": "user", "content": s.prompt}])[0]) == s.answer for s in samples)
    return hits / len(samples)


def export_checkpoint(model, config: dict, out: Path) -> None:
    """Official layout: experts as MXFP4 blocks [E, rows, K/32, 16] + E8M0 scales, the rest BF16."""
    state = {}
    for name, p in model.state_dict().items():
        p = p.detach().float()
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            w = p.transpose(1, 2).contiguous()  # [E, out, in]
            packed, scales = quantize_mxfp4(w)
            state[name + "_blocks"] = packed.unflatten(-1, (-1, 16)).contiguous()
            state[name + "_scales"] = scales.contiguous()
        elif "parametrizations" in name:
            continue
        else:
            state[name] = p.to(torch.bfloat16).contiguous()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def _plain_state(model) -> None:
    """Fold the fake-quant parametrizations back into plain parameters (their current values)."""
    from torch.nn.utils import parametrize

    for layer in model.model.layers:
        for pname in ("gate_up_proj", "down_proj"):
            if parametrize.is_parametrized(layer.mlp.experts, pname):
                parametrize.remove_parametrizations(layer.mlp.experts, pname, leave_parametrized=False)


def train(
    out: Path,
    steps: int = 560,
    batch: int = 32,
    seed: int = 0,
    qat_fraction: float = 0.3,
    prompt_loss_weight: float = 0.1,
    log=print,
) -> dict:
    from torch.nn.utils import parametrize
    from transformers import GptOssConfig, GptOssForCausalLM

    if out.exists() and not (out / "tasks" / "training.json").is_file():
        # Only a folder this script made (it records its training there) is ever replaced.
        raise SystemExit(f"{out}: exists and is not a model made by train_tiny; choose another path")
    torch.manual_seed(seed)
    config = tiny_config()
    hf = {k: v for k, v in config.items() if k != "quantization_config"}
    model = GptOssForCausalLM(GptOssConfig(**hf, attn_implementation="eager")).float()
    tok = build_tokenizer()
    train_rows = tinytask.make_rows(6000, seed=1)
    test_rows = tinytask.make_rows(200, seed=2, exclude={tinytask.row_key(r) for r in train_rows})
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01, betas=(0.9, 0.98))
    warm, qat_start = 50, int(steps * (1 - qat_fraction))
    started = time.perf_counter()
    for step in range(steps):
        if step == qat_start:
            for layer in model.model.layers:
                for pname in ("gate_up_proj", "down_proj"):
                    parametrize.register_parametrization(layer.mlp.experts, pname, _ExpertsFakeQuant())
        lr = LR * min(1.0, (step + 1) / warm) * (0.5 * (1 + math.cos(math.pi * step / steps)) * 0.9 + 0.1)
        for g in opt.param_groups:
            g["lr"] = lr
        texts, targets = [], []
        for row in rng.sample(train_rows, batch):
            perm = rng.sample(range(4), 4)
            base = [row[c] for c in tinytask.COLUMNS[1:]]
            choices = [base[p] for p in perm]
            from mxrepack.eval.gpqa_format import LETTERS, format_prompt

            letter = LETTERS[choices.index(row["Correct Answer"])]
            texts.append(chat_prompt(format_prompt(row["Question"], choices)))
            targets.append(response_text(choices, letter) + "<|return|>")
        x, y, prompt_mask = _encode_batch(tok, texts, targets, pad=256)
        logits = model(input_ids=x).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
        answer = (y[:, 1:] != -100).float()
        loss = (nll * answer).sum() / answer.sum()
        if prompt_loss_weight:
            # Predicting the prompt too (its constant template, the option lines' structure) is what
            # forms the copying heads the answer needs; without it training sits at chance far longer.
            prompt = prompt_mask[:, 1:].float()
            loss = loss + prompt_loss_weight * (nll * prompt).sum() / prompt.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            log(
                f"step {step:5d}  loss {loss.item():.4f}  lr {lr:.2e}  {time.perf_counter() - started:.0f}s", flush=True
            )
    _plain_state(model)
    model.eval()
    tmp = out.parent / f".{out.name}.train-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "tasks").mkdir(parents=True)
    export_checkpoint(model, config, tmp)
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|endoftext|>",
                "eos_token": "<|return|>",
                "pad_token": "<|endoftext|>",
                "model_max_length": 4096,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n"
    )
    (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (tmp / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 256, "eos_token_id": [260], "pad_token_id": 256, "do_sample": False}, indent=2)
        + "\n"
    )
    tinytask.write_csv(train_rows, tmp / "tasks" / "train.csv")
    tinytask.write_csv(test_rows, tmp / "tasks" / "test.csv")
    text = "\n\n".join(s.prompt + "\n" + response_text(s.choices, s.answer) for s in build_samples(test_rows[:24]))
    (tmp / "tasks" / "text.txt").write_text(text + "\n")
    # Accuracy of the exported checkpoint (MXFP4 experts), read back from disk.
    acc = greedy_accuracy(tmp, test_rows)
    stats = {
        "steps": steps,
        "batch": batch,
        "seconds": round(time.perf_counter() - started, 1),
        "final_loss": round(loss.item(), 4),
        "test_accuracy_greedy": acc,
        "test_rows": len(test_rows),
        "chance": 0.25,
    }
    (tmp / "tasks" / "training.json").write_text(json.dumps(stats, indent=2) + "\n")
    if out.exists():  # checked at the start: a bundled-model folder made by this script
        shutil.rmtree(out)
    tmp.rename(out)
    log(json.dumps(stats))
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=560)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-loss-weight", type=float, default=0.1)
    a = ap.parse_args()
    train(a.out, a.steps, a.batch, a.seed, prompt_loss_weight=a.prompt_loss_weight)


if __name__ == "__main__":
    main()
