"""Calibrated dense quantization through llm-compressor (optional: ``pip install mxrepack[calib]``).

llm-compressor pins its own compressed-tensors and transformers versions (shared/docs/deps.md), so it
is not a dependency of mxrepack; this module imports it only when called. It runs GPTQ with the
``MXFP4A16`` preset (MXFP4 weights, group 32, E8M0 scales) on the dense attention layers of a model
small enough to load, and reports the output error on held-out activations against mxrepack's
data-free quantization of the same weights (the compressed-tensors scale rule, so the two differ
only by GPTQ's error feedback).

    python -m mxrepack.eval.calibrate MODEL_DIR [--samples 128] [--json out.json]

MODEL_DIR is a checkpoint with tokenizer and task files (the bundled tiny model by default).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from mxrepack.errors import MxRepackError

ATTENTION = r"re:.*self_attn\.(q|k|v|o)_proj$"


def _require_llmcompressor():
    import importlib.util

    if importlib.util.find_spec("llmcompressor") is None:
        raise MxRepackError(
            "calibration needs llm-compressor: pip install 'mxrepack[calib]' "
            "(in its own environment: it pins compressed-tensors and transformers)"
        )


def _texts(model_dir: Path, split: str, n: int) -> list[str]:
    from mxrepack.eval.gpqa_format import build_samples, read_rows
    from mxrepack.eval.local import load_chat_template

    template = load_chat_template(model_dir)
    rows = read_rows(model_dir / "tasks" / f"{split}.csv")
    return [
        template.render(messages=[{"role": "user", "content": s.prompt}], add_generation_prompt=True)
        for s in build_samples(rows)[:n]
    ]


def _linear_inputs(model, tokenizer, texts: list[str]) -> dict[str, torch.Tensor]:
    """Each attention Linear's inputs on ``texts`` (forward hooks on a transformers model)."""
    acts: dict[str, list] = {}
    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".self_attn." in name:
            hooks.append(
                mod.register_forward_hook(
                    lambda m, i, o, n=name: acts.setdefault(n, []).append(i[0].reshape(-1, i[0].shape[-1]).float())
                )
            )
    with torch.no_grad():
        for t in texts:
            model(**tokenizer(t, return_tensors="pt", add_special_tokens=False))
    for h in hooks:
        h.remove()
    return {k: torch.cat(v) for k, v in acts.items()}


def compare_gptq(model_dir: str | Path, samples: int = 128, held_out: int = 64) -> dict:
    _require_llmcompressor()
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from mxrepack.quant import FP4_VALUES, dequantize_mxfp4, quantize_mxfp4
    from mxrepack.repack.pipeline import repack

    model_dir = Path(model_dir)
    work = Path(tempfile.mkdtemp(prefix="mxrepack-calib-"))
    try:
        bf16 = repack(str(model_dir), "bf16", work / "bf16").out  # a checkpoint stock transformers loads
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(model_dir / f, bf16 / f)
        tok = PreTrainedTokenizerFast(tokenizer_file=str(bf16 / "tokenizer.json"))
        model = AutoModelForCausalLM.from_pretrained(bf16, dtype=torch.float32)
        original = {
            n: m.weight.detach().clone()
            for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and ".self_attn." in n
        }
        test_inputs = _linear_inputs(model, tok, _texts(model_dir, "test", held_out))
        calib = _texts(model_dir, "train", samples)
        from datasets import Dataset

        ds = Dataset.from_dict({"input_ids": [tok(t, add_special_tokens=False)["input_ids"] for t in calib]})
        started = time.perf_counter()
        oneshot(
            model=model,
            dataset=ds,
            recipe=GPTQModifier(targets=[ATTENTION], scheme="MXFP4A16"),
            num_calibration_samples=len(calib),
            max_seq_length=512,
        )
        seconds = time.perf_counter() - started
        rows = {}
        for name, w in original.items():
            mod = model.get_submodule(name)
            w_gptq = mod.weight.detach().float()
            w_free = dequantize_mxfp4(*quantize_mxfp4(w, "compressed-tensors"), torch.float32)
            x = test_inputs[name]
            ref = (x @ w.T).norm()
            grid = None
            if hasattr(mod, "weight_scale"):  # GPTQ's output must lie on its MXFP4 grid: w / scale in E2M1
                q = w_gptq.unflatten(-1, (-1, 32)) / mod.weight_scale.detach().float().unsqueeze(-1)
                grid = bool(torch.isin(q.abs(), torch.tensor(FP4_VALUES[:8])).all())
            rows[name] = {
                "on_mxfp4_grid": grid,
                "data_free_out_rel": float((x @ (w_free - w).T).norm() / ref),
                "gptq_out_rel": float((x @ (w_gptq - w).T).norm() / ref),
                "data_free_weight_rel": float((w_free - w).norm() / w.norm()),
                "gptq_weight_rel": float((w_gptq - w).norm() / w.norm()),
            }
        mean = {
            k: sum(r[k] for r in rows.values()) / len(rows) for k in next(iter(rows.values())) if k != "on_mxfp4_grid"
        }
        return {
            "model": str(model_dir),
            "scheme": "MXFP4A16",
            "targets": ATTENTION,
            "calibration_samples": len(calib),
            "held_out_prompts": held_out,
            "gptq_seconds": round(seconds, 1),
            "mean": mean,
            "output_error_reduction": 1 - mean["gptq_out_rel"] / mean["data_free_out_rel"],
            "all_on_mxfp4_grid": all(r["on_mxfp4_grid"] for r in rows.values()),
            "layers": rows,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description="GPTQ (llm-compressor, MXFP4A16) vs data-free MXFP4 on dense attention layers"
    )
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.model is None:
        from mxrepack.eval.bundled import bundled_model

        a.model = bundled_model()
    r = compare_gptq(a.model, a.samples)
    print(json.dumps({k: v for k, v in r.items() if k != "layers"}, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=2) + "\n")


if __name__ == "__main__":
    main()
