"""Model-level fidelity of a candidate checkpoint to a reference, over a token set (llama.cpp's
``--kl-divergence`` conventions, evals.md): KL(ref || cand) per position (mean, median, p99, p99.9,
max), top-1 agreement ("same top p"), perplexity of each and the ratio, per-position figures, and a
first-token check: after each prompt's chat template, the first generated token's distribution (a
broken first token is how vLLM's Marlin on GB10 failed while "working": vLLM #37030).

Token set: a text file (the bundled tiny model ships ``tasks/text.txt``), split into windows of
``ctx`` tokens; prompts for the first-token check are the text's paragraphs (blank-line separated).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from mxrepack.errors import MxRepackError, read_text, require_folder
from mxrepack.eval.local import LocalChatModel
from mxrepack.progress import Progress
from mxrepack.serve.spec import weights_identity


def _quantile(x: torch.Tensor, q: float) -> float:
    return float(torch.quantile(x.double(), q)) if x.numel() else float("nan")


def kl_stats(ref_logits: torch.Tensor, cand_logits: torch.Tensor, targets: torch.Tensor | None = None) -> dict:
    """Per-position KL(ref || cand), top-1 agreement and (with ``targets``) the NLL of both."""
    lp = torch.log_softmax(ref_logits.double(), -1)
    lq = torch.log_softmax(cand_logits.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1).clamp(min=0)
    out = {"kl": kl, "same_top": ref_logits.argmax(-1) == cand_logits.argmax(-1)}
    if targets is not None:
        out["nll_ref"] = -lp.gather(-1, targets[:, None])[:, 0]
        out["nll_cand"] = -lq.gather(-1, targets[:, None])[:, 0]
    return out


def compare_logits(
    ref: str | Path,
    cand: str | Path,
    text: str | Path | None = None,
    ctx: int = 256,
    max_tokens: int = 4096,
    first_token_prompts: int = 16,
    hist_bins: int = 20,
    progress: Progress | None = None,
) -> dict:
    """``progress(done, total, phase)``: positions scored, then first-token prompts run."""
    if ctx < 1 or max_tokens < 2:
        raise MxRepackError(f"--ctx {ctx} / --max-tokens {max_tokens}: expected at least 1 and 2 tokens")
    require_folder(ref)  # named as the checkpoint it is, not as a missing text in it
    text_path = Path(text) if text else Path(ref) / "tasks" / "text.txt"
    if text and text_path.is_dir():
        raise MxRepackError(f"{text_path}: is a folder; expected a text file (--text)")
    if not text_path.is_file():  # before two models load: only the bundled tiny model carries a text
        raise MxRepackError(f"{text_path}: no token set; pass --text FILE")
    raw = read_text(text_path, "a text to score (--text)")
    if not raw.strip():  # blank lines scored a few newlines and said "first token ok" over no prompt
        raise MxRepackError(f"{text_path}: empty or only whitespace; expected a text to score (--text)")
    ref_model, cand_model = LocalChatModel(ref), LocalChatModel(cand)
    sizes = (ref_model.runner.d.vocab, cand_model.runner.d.vocab)
    if sizes[0] != sizes[1]:  # logits of two models' vocabularies do not compare
        raise MxRepackError(f"{cand}: vocabulary of {sizes[1]} tokens, where the reference {ref} has {sizes[0]}")
    ids = ref_model.tokenizer.encode(raw, add_special_tokens=False).ids[:max_tokens]
    if len(ids) < 2:
        raise MxRepackError(f"{text_path}: fewer than 2 tokens")
    kls, same, nll_r, nll_c, positions = [], [], [], [], []
    scored = 0
    for start in range(0, len(ids) - 1, ctx):
        window = torch.tensor(ids[start : start + ctx + 1])
        if window.numel() < 2:
            break
        a = ref_model.runner.forward(window[:-1])
        b = cand_model.runner.forward(window[:-1])
        s = kl_stats(a, b, window[1:])
        kls.append(s["kl"])
        same.append(s["same_top"])
        nll_r.append(s["nll_ref"])
        nll_c.append(s["nll_cand"])
        positions.append(torch.arange(window.numel() - 1))
        scored += window.numel() - 1
        if progress:
            progress(scored, len(ids) - 1, "positions")
    kl, agree = torch.cat(kls), torch.cat(same).float()
    nr, nc, pos = torch.cat(nll_r), torch.cat(nll_c), torch.cat(positions)
    ppl_r, ppl_c = math.exp(float(nr.mean())), math.exp(float(nc.mean()))
    # ln(PPL ratio) = mean(nll_c - nll_r); its standard error from the per-token differences
    diff = (nc - nr).double()
    se = float(diff.std() / math.sqrt(diff.numel())) if diff.numel() > 1 else 0.0
    buckets = [(0, 16), (16, 64), (64, 256), (256, 1 << 30)]
    per_position = [
        {
            "positions": f"{lo}-{min(hi, int(pos.max()) + 1) - 1}",
            "n": int(m.sum()),
            "kl_mean": float(kl[m].mean()),
            "same_top": float(agree[m].mean()),
        }
        for lo, hi in buckets
        for m in [(pos >= lo) & (pos < hi)]
        if m.any()
    ]
    first = _first_token(ref_model, cand_model, raw, first_token_prompts, progress)
    edges = torch.logspace(-8, 1, hist_bins + 1, dtype=torch.float64)
    counts = torch.histogram(kl.clamp(1e-8, 10), bins=edges).hist.tolist()
    return {
        "eval": "logits",
        # absolute: `repack push --eval` checks the candidate is the output it publishes, from any folder
        "reference": str(Path(ref).absolute()),
        "candidate": str(Path(cand).absolute()),
        "candidate_weights": weights_identity(cand),  # what push --eval compares with the output it publishes
        "text": str(text_path),
        "tokens": int(kl.numel()),
        "ctx": ctx,
        "kl": {
            "mean": float(kl.mean()),
            "median": _quantile(kl, 0.5),
            "p99": _quantile(kl, 0.99),
            "p99_9": _quantile(kl, 0.999),
            "max": float(kl.max()),
        },
        "same_top": float(agree.mean()),
        "ppl": {
            "reference": ppl_r,
            "candidate": ppl_c,
            "ratio": ppl_c / ppl_r,
            "ln_ratio_stderr": se,
            "delta": ppl_c - ppl_r,
        },
        "per_position": per_position,
        "first_token": first,
        "kl_histogram": {"edges": edges.tolist(), "counts": [int(c) for c in counts]},
    }


def _first_token(ref: LocalChatModel, cand: LocalChatModel, raw: str, n: int, progress: Progress | None = None) -> dict:
    prompts = [p.strip() for p in raw.split("\n\n") if p.strip()][:n]
    kls, same = [], []
    for done, p in enumerate(prompts, 1):
        ids = torch.tensor(ref.prompt_ids([{"role": "user", "content": p}]))
        a, b = ref.runner.forward(ids)[-1:], cand.runner.forward(ids)[-1:]
        s = kl_stats(a, b)
        kls.append(float(s["kl"][0]))
        same.append(bool(s["same_top"][0]))
        if progress:
            progress(done, len(prompts), "first-token prompts")
    return {
        "prompts": len(prompts),
        "same_top": (sum(same) / len(same)) if same else None,
        "kl_mean": (sum(kls) / len(kls)) if kls else None,
        "kl_max": max(kls) if kls else None,
        "ok": all(same),
    }
