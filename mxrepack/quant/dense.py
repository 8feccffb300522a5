"""Data-free MX quantization of gpt-oss's dense layers: which tensors, and what it costs in error.

Selection (recipe ``dense.layers``, CLI ``--dense-layers``): layer keys ``q``, ``k``, ``v``, ``o``,
``lm_head``, ``embed`` (embed_tokens: a lookup table, quantized by rows like a weight), ``router``
(kept BF16 unless named); the aliases ``qkv`` and ``attn`` (q, k, v, o); a module name
(``model.layers.3.self_attn.o_proj``); or a regex over weight names (``re:...``). An entry that
matches no tensor is an error, never a silent no-op.

Error report, per quantized tensor (:class:`ErrorStats`, accumulated chunk by chunk as the weight
streams through): relative Frobenius error, SQNR in dB, max abs error, and the relative output
error ``||x (W_q - W)^T|| / ||x W^T||`` on random activations (16 rows of N(0, 1), seeded by the
tensor name) and, when given, on recorded activations (a safetensors file mapping weight names to
``[m, K]`` inputs, e.g. from ``repack eval record-activations``).
"""

from __future__ import annotations

import math
import re
import zlib
from pathlib import Path

import torch

from mxrepack.errors import MxRepackError

LAYER_KEYS = {
    "q": r"model\.layers\.\d+\.self_attn\.q_proj\.weight",
    "k": r"model\.layers\.\d+\.self_attn\.k_proj\.weight",
    "v": r"model\.layers\.\d+\.self_attn\.v_proj\.weight",
    "o": r"model\.layers\.\d+\.self_attn\.o_proj\.weight",
    "lm_head": r"lm_head\.weight",
    "embed": r"model\.embed_tokens\.weight",
    "router": r"model\.layers\.\d+\.mlp\.router\.weight",
}
ALIASES = {"qkv": ("q", "k", "v"), "attn": ("q", "k", "v", "o")}
DEFAULT_LAYERS = ("qkv", "o", "lm_head")
RANDOM_ROWS = 16


def parse_layers(value: str | list | tuple) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(i).strip() for i in items if str(i).strip()]


def layer_pattern(entry: str) -> re.Pattern:
    if entry in ALIASES:
        return re.compile("|".join(f"(?:{LAYER_KEYS[k]})" for k in ALIASES[entry]))
    if entry in LAYER_KEYS:
        return re.compile(LAYER_KEYS[entry])
    if entry.startswith("re:"):
        try:
            return re.compile(entry[3:])
        except re.error as e:
            raise MxRepackError(f"dense.layers: '{entry}' is not a valid regex ({e})") from None
    if re.fullmatch(r"[\w.]+", entry) and "." in entry:  # a module name
        return re.compile(re.escape(entry.removesuffix(".weight")) + r"\.weight")
    raise MxRepackError(
        f"dense.layers: unknown entry '{entry}' (valid: {', '.join([*LAYER_KEYS, *ALIASES])}, "
        "a module name such as model.layers.0.self_attn.o_proj, or re:REGEX)"
    )


def select_dense(names: list[str], layers: list[str], where: str = "dense.layers") -> list[str]:
    """The weight names (in ``names`` order) chosen by ``layers``; each entry must match something."""
    chosen: set[str] = set()
    weights = [n for n in names if n.endswith(".weight") and ".mlp.experts." not in n and "norm" not in n]
    for entry in layers:
        pattern = layer_pattern(entry)
        hits = [n for n in weights if pattern.fullmatch(n)]
        if not hits:
            raise MxRepackError(f"{where}: '{entry}' matches no dense weight of this checkpoint")
        chosen.update(hits)
    return [n for n in names if n in chosen]


def load_activations(path: str | Path | None, weight_shapes: dict[str, tuple] | None = None) -> dict[str, torch.Tensor]:
    """Recorded layer inputs (weight name -> ``[m, K]``). ``weight_shapes``: the checkpoint's, to refuse a file of
    the weights themselves (same names; every tensor ``[N, K]``, which no run of tokens repeats on every layer)."""
    if path is None:
        return {}
    from safetensors.torch import load_file

    try:
        acts = {k: v.float() for k, v in load_file(str(path)).items()}
    except FileNotFoundError:
        raise MxRepackError(f"{path}: activations file does not exist") from None
    except Exception as e:
        raise MxRepackError(f"{path}: not a safetensors file of recorded activations ({e})") from None
    if acts and weight_shapes and all(tuple(v.shape) == tuple(weight_shapes.get(k, ())) for k, v in acts.items()):
        raise MxRepackError(
            f"{path}: holds the weights themselves (each tensor its weight's [N, K]), not recorded inputs; "
            "make them with `repack eval record-activations`"
        )
    return acts


class ErrorStats:
    """Quantization error of one weight, accumulated over row chunks."""

    def __init__(self, name: str, k: int, recorded: torch.Tensor | None = None):
        self.name = name
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        self.x_random = torch.randn(RANDOM_ROWS, k, generator=g)
        if recorded is not None and recorded.shape[-1] != k:
            raise MxRepackError(f"recorded activations for '{name}': width {recorded.shape[-1]}, expected K={k}")
        self.x_recorded = None if recorded is None else recorded.reshape(-1, k).float()
        self.err2 = self.ref2 = 0.0
        self.max_abs = 0.0
        self.out = {"random": [0.0, 0.0], "recorded": [0.0, 0.0]}

    def add(self, w: torch.Tensor, q: torch.Tensor) -> None:
        w, q = w.float(), q.float()
        d = q - w

        def sq(t: torch.Tensor) -> float:  # fp32 norms per row, summed in fp64: fast and accurate
            return float(torch.linalg.vector_norm(t, dim=-1).double().square().sum()) if t.numel() else 0.0

        self.err2 += sq(d)
        self.ref2 += sq(w)
        if d.numel():
            self.max_abs = max(self.max_abs, float(d.abs().max()))
        for key, x in (("random", self.x_random), ("recorded", self.x_recorded)):
            if x is not None:
                self.out[key][0] += sq(x @ d.T)
                self.out[key][1] += sq(x @ w.T)

    def result(self) -> dict:
        def ratio(a, b):
            return math.sqrt(a / b) if b > 0 else (0.0 if a == 0 else math.inf)

        return {
            "rel_fro": ratio(self.err2, self.ref2),
            "sqnr_db": (10 * math.log10(self.ref2 / self.err2) if self.err2 > 0 else math.inf),
            "max_abs": self.max_abs,
            "out_rel_random": ratio(*self.out["random"]),
            "out_rel_recorded": ratio(*self.out["recorded"]) if self.x_recorded is not None else None,
        }


def format_error_table(report: dict[str, dict]) -> str:
    """A fixed-width table of an error report (tensor -> ErrorStats.result())."""
    if not report:
        return "(no dense tensors quantized)"
    width = max(len(n) for n in report)
    lines = [
        f"{'tensor':<{width}}  {'format':<6} {'rel_fro':>8} {'sqnr_dB':>8} {'max_abs':>9} "
        f"{'out_rand':>9} {'out_rec':>9}"
    ]
    for name, r in report.items():
        rec = "-" if r.get("out_rel_recorded") is None else f"{r['out_rel_recorded']:.4f}"
        lines.append(
            f"{name:<{width}}  {r.get('format', ''):<6} {r['rel_fro']:>8.4f} {r['sqnr_db']:>8.2f} "
            f"{r['max_abs']:>9.2e} {r['out_rel_random']:>9.4f} {rec:>9}"
        )
    return "\n".join(lines)
