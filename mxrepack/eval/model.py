"""A gpt-oss forward pass in torch that reads every checkpoint this project reads or writes.

Weights: a native source (HF or ``original/`` layout, through :func:`mxrepack.repack.source.open_checkpoint`)
or an mxrepack output (its manifest names each tensor's layout; experts go back through the layout's
exact inverse, dense MX layers through the dense layout's inverse and dequantization). Either way the
runner gets canonical names: ``model.layers.N.mlp.experts.{gate_up_proj,down_proj}`` as
``[E, out, in]`` plus biases, and every dense weight as a float matrix (MX-stored ones also keep their
packed form for the Triton fast path).

Forward (formats.md 2.3, 3.1; the same math as transformers' ``GptOssForCausalLM``): RMSNorm (eps
1e-5, weight times the normalized fp32 input); attention with GQA, YaRN RoPE on the two halves of each
head (scaled cos/sin), a learned per-head sink logit appended to each softmax row and dropped after,
sliding-window causal masks (key kept when ``q - k < window``) on the layers marked
``sliding_attention``; an MoE block whose router takes the top-k logits and softmaxes only those,
experts computing ``(up + 1) * gate * sigmoid(1.702 * gate)`` with gate clamped above at the limit and
up on both sides (gate = even, up = odd rows of gate_up); biases everywhere.

``use_kernels=True`` runs the experts through ``mxrepack.kernels.moe_mxfp4`` (strided layout, packed
from the native bytes) and MX-stored dense layers through ``linear_mxfp4``, on GPU or under the
Triton interpreter. Compute dtype defaults to float32 (the CPU reference).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mxrepack.errors import MxRepackError
from mxrepack.gptoss import EXPERT_PARTS, Dims
from mxrepack.layouts import ExpertDims, dense_weights, make_layout
from mxrepack.repack.output import is_output, read_config, read_manifest
from mxrepack.repack.safetensors_io import read_directory
from mxrepack.serve.spec import check_experts_written_by

SWIGLU_ALPHA = 1.702


@dataclass
class GptOssWeights:
    config: dict  # transformers-style config with the *logical* sizes
    dense: dict[str, torch.Tensor]  # canonical name -> float tensor (everything but the experts)
    experts: dict[int, dict[str, torch.Tensor]]  # layer -> native parts (blocks/scales/bias) or dense parts
    mx: dict[str, tuple[str, torch.Tensor, torch.Tensor]] = field(
        default_factory=dict
    )  # weight -> (format, values, scales)
    source: str = ""

    @property
    def dims(self) -> Dims:
        return Dims.from_config(self.config)


def load_weights(path: str | Path) -> GptOssWeights:
    """Canonical weights of a checkpoint directory: an mxrepack output (has ``mxrepack.json``) or a source."""
    path = Path(path)
    if is_output(path):
        return _load_output(path)
    from mxrepack.repack.source import open_checkpoint

    ck = open_checkpoint(str(path))
    dense, experts = {}, {}
    for name, src in ck.tensors.items():
        if ".mlp.experts." in name:
            layer = int(name.split(".")[2])
            experts.setdefault(layer, {})[name.rsplit(".", 1)[1]] = src.read()
        else:
            dense[name] = src.read()
    return GptOssWeights(dict(ck.config), dense, experts, source=str(path))


def _load_output(path: Path) -> GptOssWeights:
    manifest = read_manifest(path)
    recipe = manifest.recipe
    config = read_config(path)
    dims = manifest.source_dims
    if dims:  # the logical sizes (a target may pad intermediate_size in its config)
        config["intermediate_size"] = dims["intermediate"]
    from mxrepack.repack.source import config_dims

    d = config_dims(config, path / "config.json")  # a size missing or not a number: one line naming the file
    check_experts_written_by(recipe.expert_layout, recipe.expert_options, manifest.written_by)  # before any read
    layout = make_layout(recipe.expert_layout, recipe.expert_options)
    stored = read_directory(path)
    dense_layout = recipe.dense_layout
    dense, experts, mx = {}, {}, {}
    per_layer: dict[int, dict[str, list]] = {}
    absent = next((name for name in manifest.tensors if name not in stored), None)
    if absent is not None:
        raise MxRepackError(
            f"{path}: tensor '{absent}' of the manifest is in none of its shards; `repack verify {path}` says more"
        )
    for name, entry in manifest.tensors.items():
        t = stored[name]
        if ".mlp.experts." in name:
            layer = int(name.split(".")[2])
            rest = name.split(".mlp.experts.", 1)[1]
            if layout.per_expert:
                e, part = rest.split(".", 1)
                per_layer.setdefault(layer, {}).setdefault("{e}." + part, []).append((int(e), t))
            else:
                per_layer.setdefault(layer, {})[rest] = [(0, t)]
        elif dense_layout is not None and entry["layout"] == dense_layout.name:
            if entry["logical_shape"] and name.endswith("weight_scale"):
                module = name.rsplit(".", 1)[0]
                values = stored[module + (".weight_packed" if dense_layout.format == "mxfp4" else ".weight")]
                n = entry["logical_shape"][0]
                k = entry["logical_shape"][1] * 32
                v, s = dense_layout.unpack(values, t, (n, k))
                mx[module + ".weight"] = (dense_layout.format, v, s)
                dense[module + ".weight"] = dense_layout.dequantize(v, s, torch.float32)
        else:
            dense[name] = t
    edims = ExpertDims(d.experts, d.hidden, d.intermediate)
    for layer, parts in per_layer.items():
        stacked = {
            k: torch.stack([t for _, t in sorted(v, key=lambda p: p[0])])
            if len(v) > 1 or layout.per_expert
            else v[0][1]
            for k, v in parts.items()
        }
        experts[layer] = layout.unpack(stacked, edims)
    missing = [n for n in ("model.embed_tokens.weight", "lm_head.weight") if n not in dense]
    if missing:
        raise MxRepackError(f"{path}: {missing[0]} not found in the output")
    return GptOssWeights(config, dense, experts, mx, source=str(path))


def yarn_inv_freq(config: dict) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and cos/sin scale of gpt-oss's YaRN RoPE (NTK-by-parts; formats.md 2.3)."""
    head_dim = config.get("head_dim", 64)
    base = config.get("rope_theta", 150000.0)
    rs = config.get("rope_scaling") or config.get("rope_parameters") or {}
    factor = rs.get("factor", 1.0)
    pos = base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    if rs.get("rope_type", rs.get("type")) != "yarn" or factor <= 1:
        return 1.0 / pos, 1.0
    original = rs.get("original_max_position_embeddings", config.get("initial_context_length", 4096))
    fast, slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(fast), correction_dim(slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp  # 1: keep the original frequency (high-frequency dims), 0: interpolate
    inv = (1.0 / (factor * pos)) * (1 - extrapolate) + (1.0 / pos) * extrapolate
    return inv, 0.1 * math.log(factor) + 1.0


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * h).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def swiglu(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    gate = gate_up[..., 0::2].clamp(max=limit)
    up = gate_up[..., 1::2].clamp(-limit, limit)
    return (up + 1) * gate * torch.sigmoid(SWIGLU_ALPHA * gate)


class KVCache:
    def __init__(self, layers: int):
        self.k: list[torch.Tensor | None] = [None] * layers
        self.v: list[torch.Tensor | None] = [None] * layers

    @property
    def length(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[1]


class GptOssRunner:
    """Logits and greedy/sampled generation for one sequence at a time (``ids [T]``)."""

    def __init__(
        self,
        weights: GptOssWeights,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        use_kernels: bool = False,
    ):
        self.w = weights
        self.c = weights.config
        self.d = weights.dims
        self.dtype, self.device = dtype, torch.device(device)
        self.use_kernels = use_kernels
        self.t = {k: v.to(self.device, dtype if v.is_floating_point() else v.dtype) for k, v in weights.dense.items()}
        self.experts = {}
        for layer, parts in weights.experts.items():
            self.experts[layer] = {k: v.to(self.device, dtype) for k, v in dense_weights(parts).items()}
        inv, self.rope_scale = yarn_inv_freq(self.c)
        self.inv_freq = inv.to(self.device)
        self.eps = self.c.get("rms_norm_eps", 1e-5)
        self.limit = self.c.get("swiglu_limit", 7.0)
        self.top_k = self.c.get("num_experts_per_tok", self.c.get("experts_per_token", 4))
        types = self.c.get("layer_types") or [
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(self.d.layers)
        ]
        self.window = [self.c.get("sliding_window") if t == "sliding_attention" else None for t in types]
        self._kernel_experts: dict[int, dict[str, torch.Tensor]] = {}
        self._record: dict | None = None
        if use_kernels:
            self._prepare_kernels()

    # -- Triton fast path -------------------------------------------------------------------------
    def _prepare_kernels(self) -> None:
        from mxrepack.kernels.dequant_mxfp4 import fits_fold, fold_shift
        from mxrepack.layouts import get_layout

        strided = get_layout("strided")
        dims = ExpertDims(self.d.experts, self.d.hidden, self.d.intermediate)
        for layer, parts in self.w.experts.items():
            if not all(p in parts for p in EXPERT_PARTS):
                raise MxRepackError("use_kernels needs MXFP4 experts (this checkpoint's experts are BF16)")
            self._kernel_experts[layer] = {
                s.suffix: s.pack(**{i: parts[i] for i in s.inputs}).to(self.device) for s in strided.outputs(dims)
            }
        self.mx = {
            k: (fmt, v.to(self.device), s.to(self.device)) for k, (fmt, v, s) in self.w.mx.items() if fmt == "mxfp4"
        }
        # which weights take the kernels' folded decode (asked once here: it synchronizes); the experts' with the
        # shift their scales need (dequant_mxfp4.fold_shift)
        self._fold = {k: fits_fold(s) for k, (_, _, s) in self.mx.items()}
        self._expert_shift = {
            layer: fold_shift(w["w13_weight_scale"], w["w2_weight_scale"]) for layer, w in self._kernel_experts.items()
        }

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        w = name + ".weight"
        if self._record is not None:
            self._record.setdefault(w, []).append(x.detach().float().cpu())
        bias = self.t.get(name + ".bias")
        if self.use_kernels and w in self.mx:
            from mxrepack.kernels.linear_mxfp4 import linear_mxfp4

            _, v, s = self.mx[w]
            y = linear_mxfp4(
                x.to(torch.bfloat16),
                v,
                s,
                bias.to(torch.float32) if bias is not None else None,
                fold_scale=self._fold[w],
            )
            return y.to(self.dtype)
        y = x @ self.t[w].T
        return y + bias if bias is not None else y

    # -- the model --------------------------------------------------------------------------------
    def attention(self, layer: int, x: torch.Tensor, pos: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        p = f"model.layers.{layer}.self_attn."
        T = x.shape[0]
        hd, nh, nkv = self.d.head_dim, self.d.heads, self.d.kv_heads
        q = self.linear(x, p + "q_proj").view(T, nh, hd)
        k = self.linear(x, p + "k_proj").view(T, nkv, hd)
        v = self.linear(x, p + "v_proj").view(T, nkv, hd)
        freqs = pos.to(torch.float32)[:, None] * self.inv_freq[None]
        cos = (freqs.cos() * self.rope_scale).to(self.dtype)[:, None]
        sin = (freqs.sin() * self.rope_scale).to(self.dtype)[:, None]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if cache is not None:
            if cache.k[layer] is not None:
                k = torch.cat([cache.k[layer].transpose(0, 1), k])
                v = torch.cat([cache.v[layer].transpose(0, 1), v])
            cache.k[layer], cache.v[layer] = k.transpose(0, 1), v.transpose(0, 1)
        S = k.shape[0]
        group = nh // nkv
        kk = k.transpose(0, 1).repeat_interleave(group, 0)  # [nh, S, hd]
        vv = v.transpose(0, 1).repeat_interleave(group, 0)
        scores = (q.transpose(0, 1) @ kk.transpose(1, 2)) * hd**-0.5  # [nh, T, S]
        qpos = pos[:, None]
        kpos = torch.arange(S, device=x.device)[None]
        allowed = kpos <= qpos
        if self.window[layer]:
            allowed &= qpos - kpos < self.window[layer]
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        sinks = self.t[p + "sinks"].to(scores.dtype).view(nh, 1, 1).expand(nh, T, 1)
        logits = torch.cat([scores, sinks], -1)
        logits = logits - logits.max(-1, keepdim=True).values
        probs = torch.softmax(logits, -1)[..., :-1]
        out = (probs @ vv).transpose(0, 1).reshape(T, nh * hd)
        return self.linear(out, p + "o_proj")

    def moe(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        p = f"model.layers.{layer}.mlp."
        logits = self.linear(x, p + "router")
        top, ids = torch.topk(logits, self.top_k, dim=-1)
        wts = torch.softmax(top, dim=-1)
        if self.use_kernels:
            from mxrepack.kernels.moe_mxfp4 import moe_mxfp4

            experts = self._kernel_experts[layer]
            shift = self._expert_shift[layer]
            y = moe_mxfp4(
                x.to(torch.bfloat16),
                ids.to(torch.int32),
                wts.float(),
                experts,
                fold_scale=shift is not None,
                scale_shift=shift or 0,
            )
            return y.to(self.dtype)
        w = self.experts[layer]
        out = torch.zeros_like(x)
        for e in ids.unique().tolist():
            rows, slot = (ids == e).nonzero(as_tuple=True)
            h = x[rows] @ w["gate_up_proj"][e].T + w["gate_up_proj_bias"][e]
            y = swiglu(h, self.limit) @ w["down_proj"][e].T + w["down_proj_bias"][e]
            out.index_add_(0, rows, y * wts[rows, slot, None])
        return out

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, cache: KVCache | None = None, hidden: dict | None = None) -> torch.Tensor:
        """``ids [T]`` -> logits ``[T, V]`` (float32). With ``cache``, ``ids`` continue the cached prefix.
        ``hidden``, if given, receives each Linear's inputs (``name.weight -> [[T, K], ...]``)."""
        self._record = hidden
        try:
            return self._forward(ids, cache)
        finally:
            self._record = None

    def _forward(self, ids: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        ids = ids.to(self.device)
        start = cache.length if cache is not None else 0
        pos = torch.arange(start, start + ids.shape[0], device=self.device)
        x = self.t["model.embed_tokens.weight"][ids].to(self.dtype)
        for layer in range(self.d.layers):
            p = f"model.layers.{layer}."
            h = rms_norm(x, self.t[p + "input_layernorm.weight"], self.eps)
            x = x + self.attention(layer, h, pos, cache)
            h = rms_norm(x, self.t[p + "post_attention_layernorm.weight"], self.eps)
            x = x + self.moe(layer, h)
        h = rms_norm(x, self.t["model.norm.weight"], self.eps)
        return self.linear(h, "lm_head").float()

    @torch.no_grad()
    def generate(
        self, ids: list[int], max_new_tokens: int, stop: set[int] | None = None, temperature: float = 0.0, seed: int = 0
    ) -> list[int]:
        """Greedy (temperature 0) or sampled continuation of ``ids``, with a KV cache."""
        cache = KVCache(self.d.layers)
        g = torch.Generator().manual_seed(seed)
        logits = self.forward(torch.tensor(ids), cache)[-1]
        out: list[int] = []
        for _ in range(max_new_tokens):
            if temperature > 0:
                nxt = int(torch.multinomial(torch.softmax(logits.cpu() / temperature, -1), 1, generator=g))
            else:
                nxt = int(logits.argmax())
            out.append(nxt)
            if stop and nxt in stop:
                break
            logits = self.forward(torch.tensor([nxt]), cache)[-1]
        return out


def load_runner(path: str | Path, **kwargs) -> GptOssRunner:
    return GptOssRunner(load_weights(path), **kwargs)
