"""What an engine needs to know to serve an mxrepack output, read from its ``config.json`` alone; no engine import.

:data:`EXPERT_BACKENDS` says, per expert layout, which vLLM MoE backend computes with those bytes and on which GPUs;
:class:`ServeSpec` is a checkpoint's ``quantization_config`` parsed and checked; :func:`check_checkpoint` compares the
safetensors headers with it, so that a wrong tensor is one line naming it before an engine allocates anything;
:func:`serve_hint` is what ``repack`` prints and the model card says. The vLLM plugin (:mod:`mxrepack.serve.vllm`)
is built on these, and CI tests them without vLLM.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mxrepack.errors import MxRepackError
from mxrepack.recipes import list_recipes

QUANT_METHOD = "mxrepack"
# the byte orders of the strided layout's option ``order`` (mxrepack.layouts.strided.ORDERS; repeated here, as reading
# a config needs no torch)
STRIDED_ORDERS = ("rows", "wgmma", "mma2")
DENSE_ORDERS = STRIDED_ORDERS  # the dense layout's option ``order`` (mxrepack.layouts.dense.ORDERS): the same orders
# the release from which the strided order wgmma's words hold their bits rotated for the kernels' decode
# (mxrepack.layouts.strided.WORD_ROTATIONS); an output written before holds them byte-wise and would decode wrong
WGMMA_WORD_BITS_SINCE = "0.2.0"
VLLM_SUPPORTED = ((0, 26), (0, 34))  # [from, below): 0.26 ran on the lent H100; 0.33 is what GB10 users run
VLLM_SUPPORTED_TEXT = "0.26 to 0.33"


@dataclass(frozen=True)
class ExpertBackend:
    """How vLLM serves one expert layout."""

    layout: str
    vllm_backend: str  # vLLM's Mxfp4MoeBackend member, or "mxrepack" for mxrepack's own Triton kernels
    kernel: str
    gpus: str  # where it runs (each layout's GPU check is vLLM's `is_supported_config`, or the order's check)
    ran_here: bool  # whether this MoE kernel has run on a GPU in mxrepack's checks (RUN_HERE: where, and how)
    # layout options whose value the plugin assumes when it serves these bytes (others lay out bytes it would misread)
    served_options: tuple[tuple[str, object], ...] = ()
    # the function of vLLM's ``vllm.utils.flashinfer`` (0.26 and 0.33) that says whether the FlashInfer kernels this
    # backend runs are installed, and the compute capability majors where vLLM runs them: there, without the kernels,
    # vLLM's own reason names the GPU (:func:`missing_kernels_hint`)
    kernels_present: str | None = None
    kernels_run_on: tuple[int, ...] = ()


EXPERT_BACKENDS: dict[str, ExpertBackend] = {
    b.layout: b
    for b in (
        ExpertBackend("marlin", "MARLIN", "vLLM Marlin MXFP4 MoE (fused_marlin_moe, W4A16)", "sm80 and newer", True),
        ExpertBackend(
            "triton-hopper",
            "TRITON",
            "OpenAI triton_kernels matmul_ogs as vendored in vLLM",
            "sm90 (H100/H200)",
            True,
            # what vLLM's sm90 path swizzles with: the plugin wraps the stored bytes in these layouts
            (("value", "hopper"), ("scale", "hopper"), ("num_warps", 8)),
        ),
        ExpertBackend(
            "trtllm",
            "FLASHINFER_TRTLLM_MXFP4_BF16",
            "FlashInfer TRT-LLM-gen MXFP4 MoE",
            "sm100 (B200/GB200)",
            False,
            kernels_present="has_flashinfer_trtllm_fused_moe",
            kernels_run_on=(10,),
        ),
        ExpertBackend(
            "flashinfer-cutlass",
            "FLASHINFER_CUTLASS_MXFP4_MXFP8",
            "FlashInfer CUTLASS fused MoE, MXFP4 weights x MXFP8 activations",
            "sm100, sm120, sm121",
            False,
            kernels_present="has_flashinfer_cutlass_fused_moe",
            kernels_run_on=(10, 12),  # FlashInferExperts: MXFP4 x MXFP8 from 10.0, sm_100 and sm_120 families
        ),
        ExpertBackend(
            "strided",
            "mxrepack",
            "mxrepack's Triton MoE kernels (mxrepack.kernels.moe_mxfp4)",
            "sm80 and newer, sm120/sm121 included",
            True,
        ),
    )
}
# What ran on a GPU here, per target (docs/SERVING.md has the figures, commands and records).
_H100 = "H100, vLLM 0.26.0, 2026-11-24"
RUN_HERE = {
    "mxfp4": f"{_H100}: stock vLLM (Marlin and triton_kernels backends), the baseline of the others",
    "bf16": f"{_H100}: stock vLLM; greedy tokens equal the source's",
    "sm80": f"{_H100}: plugin, Marlin; logprobs bit-identical to stock vLLM's Marlin on the source",
    "sm89": "same bytes as sm80",
    "sm121-marlin": f"{_H100}: plugin, Marlin; logprobs bit-identical to stock vLLM's Marlin on the source",
    "sm90": f"{_H100}: plugin, triton_kernels; logprobs bit-identical to stock vLLM's triton_kernels on the source",
    "sm90-strided": (
        "H100, vLLM 0.26.0, 2026-11-26: plugin, mxrepack's Triton MoE kernels (wgmma order); loads and generates, "
        "logprobs within 0.031 of the same weights in the rows order (the plugin check's strided-wgmma case); "
        "2026-11-27 (07c438c and 5737e28, its decode GEMVs at 1-2 tokens): within 0.062 (median; p99 0.91) of stock "
        "vLLM's Marlin on the source over 12 layers of random weights"
    ),
    "sm121-strided": (
        "H100 under Triton's DISABLE_MMA_V3 (sm_12x's mma.sync code path), vLLM 0.26.0, 2026-11-27: plugin, "
        "mxrepack's Triton MoE kernels (mma2 order) beside BF16 dense; loads and generates, logprobs within 0.031 "
        "(median) of the same weights in the rows order, within 0.062 (median; p99 1.39) of stock vLLM's Marlin on the "
        "source over 12 layers of random weights. H200, 2026-11-28 (21c0cdf): as written (MXFP4 q/k/v/o/lm_head in "
        "the mma2 order too), loads and generates under DISABLE_MMA_V3; its dense layers alone within 0.125 (median) "
        "of the same values on vLLM's Marlin linear over 12 layers; not run on a GB10"
    ),
    "sm100": f"{_H100}: experts byte-equal to vLLM's own TRT-LLM conversion; the kernel needs sm100 (not run)",
    "sm120": "same layouts as sm121",
    "sm121": (
        f"{_H100}: experts byte-equal to vLLM's own FLASHINFER_CUTLASS_MXFP4_MXFP8 conversion (its kernel needs "
        "sm100/sm12x: not run); dense MXFP4 served end to end on Marlin"
    ),
    "compressed-tensors": (
        f"{_H100}: stock vLLM fails (KeyError: 'layers.0.mlp.experts.0.w2_bias'); with the plugin "
        "it serves: its experts alone give logprobs bit-identical to stock vLLM's Marlin on the "
        "source"
    ),
}
# The kernels the plugin can run a checkpoint's MXFP4 dense layers (q/k/v/o, lm_head) on when they are stored in the
# rows order (compressed-tensors' weight_packed [N, K/2] + weight_scale [N, K/32]): the same bytes either way, chosen
# when the engine starts. The chunk orders (wgmma, mma2) have one reader, mxrepack's chunk tiles.
DENSE_KERNELS = {
    "marlin": "vLLM's Marlin MXFP4 linear (apply_fp4_marlin_linear), repacked at load by prepare_fp4_layer_for_marlin",
    "mxrepack": "mxrepack's Triton kernels (mxrepack.kernels.linear_mxfp4) on the stored bytes, nothing repacked",
}
DENSE_KERNEL_ENV = "MXREPACK_DENSE_KERNEL"
DENSE_KERNEL_DEFAULT = "marlin"  # what vLLM itself runs MXFP4 linears on at sm_12x; the other has no lead (SERVING)

# safetensors header dtype names of the torch dtypes a layout stores
_ST_DTYPES = {
    "uint8": "U8",
    "int32": "I32",
    "bfloat16": "BF16",
    "float32": "F32",
    "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fn": "F8_E4M3",
}
_DENSE_HF = re.compile(r"model\.layers\.(\d+)\.self_attn\.([qkvo])_proj")


@dataclass(frozen=True)
class ServeSpec:
    """A checkpoint's ``quantization_config`` (``quant_method: mxrepack``), checked: what the plugin serves."""

    target: str
    layout: str
    stored: dict[str, tuple[str, tuple[int, ...]]]  # expert tensor suffix -> (torch dtype name, stored shape)
    hidden: tuple[int, int]  # (logical, padded)
    intermediate: tuple[int, int]
    dense_modules: frozenset[str]  # checkpoint module names stored as MXFP4 (q/k/v/o projections, lm_head)
    expert_options: dict = field(default_factory=dict)  # the expert layout's options (groups.experts.options)
    # the dense MXFP4 values' byte order (groups.dense.order): "rows" (compressed-tensors' plain tensors) or a chunk
    # order ("wgmma", "mma2": mxrepack.layouts.dense, padded to 16 rows and 128 columns), which only mxrepack's
    # kernels read
    dense_order: str = "rows"

    @classmethod
    def from_config(cls, config: dict) -> ServeSpec:
        """Parse and check a ``config.json``; a one-line :class:`MxRepackError` for anything the plugin cannot serve."""
        qc = config.get("quantization_config")
        if not isinstance(qc, dict) or qc.get("quant_method") != QUANT_METHOD:
            method = qc.get("quant_method") if isinstance(qc, dict) else None
            raise MxRepackError(
                f"quantization_config.quant_method is {method!r}, not {QUANT_METHOD!r}: not an mxrepack GPU target"
            )
        groups = qc.get("groups") or {}
        experts = groups.get("experts")
        if not isinstance(experts, dict) or "layout" not in experts:
            raise MxRepackError("quantization_config.groups.experts is missing: the checkpoint names no expert layout")
        from mxrepack.layouts import RENAMED, make_layout  # here: the module imports no torch (benchmarks read it)

        layout = RENAMED.get(experts["layout"], experts["layout"])  # b12x: written before the rename
        if layout not in EXPERT_BACKENDS:
            raise MxRepackError(
                f"quantization_config.groups.experts.layout is {layout!r}, which no vLLM backend serves "
                f"(served: {', '.join(EXPERT_BACKENDS)})"
            )
        try:
            stored = {k: (v["dtype"], tuple(int(x) for x in v["shape"])) for k, v in experts["stored"].items()}
            h, i = int(config["hidden_size"]), int(config["intermediate_size"])
            padding = experts.get("padding") or {}  # layouts that pad nothing (triton-hopper) record none
            hidden = tuple(int(x) for x in padding.get("hidden", (h, h)))
            intermediate = tuple(int(x) for x in padding.get("intermediate", (i, i)))
        except (KeyError, TypeError, ValueError) as e:
            raise MxRepackError(
                f"quantization_config.groups.experts: missing or malformed {e} "
                "(expected stored shapes and hidden/intermediate padding)"
            ) from None
        options = experts.get("options") or {}
        if not isinstance(options, dict):
            raise MxRepackError(f"quantization_config.groups.experts.options is {options!r}, not a mapping")
        order = options.get("order", "rows")
        if layout == "strided" and order not in STRIDED_ORDERS:
            raise MxRepackError(
                f"quantization_config.groups.experts.options.order is {order!r}: this mxrepack serves the strided "
                f"orders {', '.join(STRIDED_ORDERS)} (written by a newer mxrepack?)"
            )
        check_experts_written_by(layout, options, qc.get("mxrepack_version"))
        try:  # options this mxrepack's layout does not take (a newer writer's, or one withdrawn) laid out other bytes
            written = make_layout(layout, options)
        except MxRepackError as e:
            raise MxRepackError(
                f"quantization_config.groups.experts: {e}; repack the source with this mxrepack"
            ) from None
        backend = EXPERT_BACKENDS[layout]
        for name, value in backend.served_options:
            if getattr(written, name) != value:
                raise MxRepackError(
                    f"quantization_config.groups.experts.options: {layout} experts written with {name}="
                    f"{getattr(written, name)!r}; vLLM's {backend.vllm_backend} backend reads "
                    f"{name}={value!r} only (a recipe's option, not a target's)"
                )
        missing = {"w13_weight", "w13_weight_scale", "w13_bias", "w2_weight", "w2_weight_scale", "w2_bias"} - set(
            stored
        )
        if missing:
            raise MxRepackError(f"quantization_config.groups.experts.stored lacks {', '.join(sorted(missing))}")
        dense = groups.get("dense")
        modules: frozenset[str] = frozenset()
        if dense:
            dense_order = dense.get("order", "rows")
            if dense_order not in DENSE_ORDERS:
                raise MxRepackError(
                    f"quantization_config.groups.dense.order is {dense_order!r}: this mxrepack serves the dense "
                    f"orders {', '.join(DENSE_ORDERS)} (written by a newer mxrepack?)"
                )
            # plain scales in the rows order; the chunk orders' are in the quad order ("plain" where written before
            # the config said so)
            scales = ("plain",) if dense_order == "rows" else ("quad", "plain")
            if dense.get("format") != "mxfp4" or dense.get("scales", "plain") not in scales:
                raise MxRepackError(
                    f"quantization_config.groups.dense is {dense.get('layout')!r}: the plugin serves dense MXFP4 "
                    "with plain scales (dense-mxfp4) or in a chunk order with quad-order scales only"
                )
            modules = frozenset(dense.get("modules") or ())
            _check_fused_qkv(modules)
            if dense_order != "rows" and "vocab_size" in config:  # vLLM's first parse has no dimensions yet
                _check_whole_row_tiles(modules, dense_order, config)
        else:
            dense_order = "rows"
        return cls(
            str(qc.get("target", "?")), layout, stored, hidden, intermediate, modules, dict(options), dense_order
        )

    @property
    def backend(self) -> ExpertBackend:
        """The engine backend (and kernel) the stored expert layout was written for."""
        return EXPERT_BACKENDS[self.layout]

    @property
    def strided_order(self) -> str:
        """The byte order of ``strided`` experts (option ``order``; ``"rows"`` where the config records none, as
        every output written before the option): ``"wgmma"`` is for sm_90 only, ``"mma2"`` for sm_12x and sm_8x."""
        return self.expert_options.get("order", "rows")

    @property
    def lm_head_quantized(self) -> bool:
        """Whether lm_head is stored as MXFP4 (then the plugin builds it with a quantized linear method)."""
        return "lm_head" in self.dense_modules

    def quantized_vllm_prefixes(self) -> frozenset[str]:
        """The vLLM module prefixes of the quantized dense layers (q/k/v are one ``qkv_proj`` in vLLM's gpt-oss)."""
        out = set()
        for m in self.dense_modules:
            hit = _DENSE_HF.fullmatch(m)
            if hit:
                out.add(f"model.layers.{hit[1]}.attn." + ("o_proj" if hit[2] == "o" else "qkv_proj"))
            else:
                out.add(m)
        return frozenset(out)

    def expected_tensors(self, config: dict) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Every tensor this spec puts in the checkpoint (experts and quantized dense), by name: (dtype, shape)."""
        out = {}
        for layer in range(int(config["num_hidden_layers"])):
            for suffix, (dtype, shape) in self.stored.items():
                out[f"model.layers.{layer}.mlp.experts.{suffix}"] = (dtype, shape)
        for m in self.dense_modules:
            n, k = _dense_shape(m, config)
            if self.dense_order != "rows":  # the chunk orders' padding (mxrepack.layouts.dense)
                n, k = -(-n // 16) * 16, -(-k // 128) * 128
            out[f"{m}.weight_packed"] = ("uint8", (n, k // 2))
            out[f"{m}.weight_scale"] = ("uint8", (n, k // 32))
        return out


def _dense_shape(module: str, config: dict) -> tuple[int, int]:
    """(rows, columns) of one dense weight (an HF module name) of the model ``config`` describes."""
    hit = _DENSE_HF.fullmatch(module)
    h = int(config["hidden_size"])
    if module == "lm_head":
        return int(config["vocab_size"]), h
    if hit is None:
        raise MxRepackError(
            f"quantization_config.groups.dense.modules names {module!r}, which is not a q/k/v/o projection or lm_head"
        )
    heads, kv, hd = (int(config[k]) for k in ("num_attention_heads", "num_key_value_heads", "head_dim"))
    return {"q": (heads * hd, h), "k": (kv * hd, h), "v": (kv * hd, h), "o": (h, heads * hd)}[hit[2]]


def _check_whole_row_tiles(modules: frozenset[str], order: str, config: dict) -> None:
    """In a chunk order each 16 stored rows are one tile; vLLM's loaders take a layer's own rows (lm_head's vocabulary,
    q/k/v's shares) from the stored ones, which cuts a tile unless they are whole tiles: one line, before loading."""
    for m in sorted(modules):
        n, _ = _dense_shape(m, config)
        if n % 16:
            raise MxRepackError(
                f"quantization_config.groups.dense: {m} has {n} rows, not whole 16-row tiles, which the {order} order "
                "needs in vLLM (its loaders would cut a tile); repack with a recipe whose dense.order is rows, or with "
                "--dense bf16"
            )


def _check_fused_qkv(modules: frozenset[str]) -> None:
    layers: dict[str, set[str]] = {}
    for m in modules:
        hit = _DENSE_HF.fullmatch(m)
        if hit and hit[2] in "qkv":
            layers.setdefault(hit[1], set()).add(hit[2])
    for layer, parts in sorted(layers.items()):
        if parts != {"q", "k", "v"}:
            raise MxRepackError(
                f"model.layers.{layer}.self_attn: only {'/'.join(sorted(parts))}_proj are MXFP4; vLLM "
                "fuses q/k/v into one layer, which must be all MXFP4 or all BF16"
            )


_CT_EXPERT = re.compile(
    r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.(weight_packed|weight_scale|bias)"
)
_CT_PARAM = {"weight_packed": "weight", "weight_scale": "weight_scale", "bias": "bias"}


def ct_gpt_oss_mxfp4_experts(quantization_config) -> bool:
    """A compressed-tensors ``quantization_config`` whose gpt-oss experts are MXFP4 per-expert Linears
    (``mxfp4-pack-quantized``): what the plugin loads into vLLM's gpt-oss MXFP4 MoE method."""
    qc = quantization_config
    if not isinstance(qc, dict) or qc.get("quant_method") != "compressed-tensors":
        return False
    return any(
        g.get("format", qc.get("format")) == "mxfp4-pack-quantized"
        and any("experts" in t for t in g.get("targets", ()))
        for g in (qc.get("config_groups") or {}).values()
        if isinstance(g, dict)
    )


def ct_expert_destination(name: str) -> tuple[str, int, int | None] | None:
    """Where a compressed-tensors per-expert tensor goes in vLLM's gpt-oss MXFP4 MoE parameters: (the fused
    parameter's checkpoint-style name, the expert, the row parity: 0 gate, 1 up -- gate/up interleaved by rows, as
    SwiGLU-OAI reads them -- or None for down). None for any other tensor."""
    hit = _CT_EXPERT.fullmatch(name)
    if hit is None:
        return None
    prefix, expert, proj, kind = hit[1], int(hit[2]), hit[3], hit[4]
    fused = f"{prefix}.{'w2' if proj == 'down' else 'w13'}_{_CT_PARAM[kind]}"
    return fused, expert, {"gate": 0, "up": 1, "down": None}[proj]


def place_ct_expert(fused, expert: int, parity: int | None, tensor, name: str) -> None:
    """Copy one expert's tensor into the fused ``[E, ...]`` parameter data ``fused`` (torch tensors), at its rows and
    in the leading corner: vLLM's parameters may be padded wider (its per-backend round-up), and the padding stays
    zero, as for the original checkpoint."""
    dst = fused[expert]
    if parity is not None:
        dst = dst[parity::2]
    if tensor.dim() != dst.dim() or any(s > d for s, d in zip(tensor.shape, dst.shape)):
        raise MxRepackError(
            f"{name}: shape {list(tensor.shape)} does not fit vLLM's expert parameter "
            f"{list(dst.shape)} (config.json's hidden/intermediate sizes disagree with the tensor)"
        )
    dst[tuple(slice(0, n) for n in tensor.shape)].copy_(tensor)


def load_config(model_dir: str | Path) -> dict:
    """``model_dir``'s ``config.json``; a one-line :class:`MxRepackError` where it is missing or not JSON."""
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise MxRepackError(f"{path}: cannot read the model config ({e})") from None


def check_checkpoint(model_dir: str | Path, spec: ServeSpec | None = None) -> ServeSpec:
    """Compare the safetensors headers of ``model_dir`` with its ``config.json``: every expert and quantized dense
    tensor present with the stored dtype and shape. Reads headers only (no tensor data, no torch)."""
    from mxrepack.repack.output import INDEX
    from mxrepack.repack.safetensors_header import raw_header

    model_dir = Path(model_dir)
    config = load_config(model_dir)
    spec = spec or ServeSpec.from_config(config)
    index = model_dir / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError) as e:
            raise MxRepackError(f"{index}: cannot read the weight map ({e})") from None
    else:
        weight_map = None
    headers: dict[str, dict] = {}
    for name, (dtype, shape) in spec.expected_tensors(config).items():
        file = weight_map.get(name) if weight_map is not None else "model.safetensors"
        if file is None:
            raise MxRepackError(
                f"{index}: {name} is missing (the config's {spec.layout} experts / dense MXFP4 need it)"
            )
        if file not in headers:
            headers[file] = raw_header(model_dir / file)[1]
        info = headers[file].get(name)
        if info is None:
            raise MxRepackError(f"{model_dir / file}: {name} is missing")
        want = (_ST_DTYPES.get(dtype, dtype), list(shape))
        if (info.get("dtype"), info.get("shape")) != want:
            raise MxRepackError(
                f"{model_dir / file}: {name} is {info.get('dtype')} {info.get('shape')}; the config's "
                f"{spec.layout} layout stores {want[0]} {want[1]}"
            )
    return spec


def _release(version) -> tuple[int, int, int]:
    """A version's release numbers, three of them: ``"0.2.0"``, ``"0.2"``, ``"0.2.0rc1"``, ``"0.2.0.dev1+g1"`` -> (0, 2,
    0); anything without one (None: a config without the key) -> (0, 0, 0), older than any release."""
    m = re.match(r"\s*v?(\d+(?:\.\d+){0,2})", str(version or ""))
    if m is None:
        return (0, 0, 0)
    parts = [int(x) for x in m.group(1).split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def check_experts_written_by(layout: str, options: dict | None, version) -> None:
    """One line when experts in ``layout`` with ``options`` (as a recipe or config records them) were written by an
    mxrepack (``version``, as the output's config or manifest records it) whose bytes this one decodes differently:
    ``strided`` in order wgmma before :data:`WGMMA_WORD_BITS_SINCE`."""
    wgmma = layout == "strided" and (options or {}).get("order") == "wgmma"
    if wgmma and _release(version) < _release(WGMMA_WORD_BITS_SINCE):
        raise MxRepackError(
            f"strided experts in order wgmma written by mxrepack {version or '(version not recorded)'}: their 32-bit "
            f"words hold the codes byte-wise, which the kernels since {WGMMA_WORD_BITS_SINCE} do not read; repack the "
            "source again"
        )


def check_moe_activation(activation: str, alpha: float | None, limit: float | None) -> None:
    """mxrepack's MoE kernels compute gpt-oss's SwiGLU (``swigluoai`` on interleaved gate/up rows) with its constants
    (``moe_mxfp4.SWIGLU_ALPHA`` / ``SWIGLU_LIMIT``): a layer that asks for another activation or other constants (a
    model other than gpt-oss under this quantization config) is refused in one line, not computed wrongly. ``None``
    constants are the activation's own (vLLM 0.26 and 0.33 give gpt-oss none; their kernels hold the same values)."""
    from mxrepack.kernels.moe_mxfp4 import SWIGLU_ALPHA, SWIGLU_LIMIT

    if activation != "swigluoai" or alpha not in (None, SWIGLU_ALPHA) or limit not in (None, SWIGLU_LIMIT):
        raise MxRepackError(
            f"the strided layout's kernels compute gpt-oss's SwiGLU (swigluoai, alpha {SWIGLU_ALPHA}, limit "
            f"{SWIGLU_LIMIT}); this MoE layer asks for {activation} (alpha {alpha}, limit {limit})"
        )


def check_moe_backend_request(requested: str | None, candidates: Iterable[str] | None, spec: ServeSpec) -> None:
    """A checkpoint's experts run on one backend only, the one their bytes are laid out for (or mxrepack's own
    kernels for ``strided``). vLLM's ``--moe-backend`` (``requested``; ``"auto"`` or None: no request) names backends
    (``candidates``: the ``Mxfp4MoeBackend`` members vLLM maps the request to, None where it knows no such name); a
    request that does not include the stored one is refused in one line, not served silently on the stored one."""
    if requested in (None, "auto"):
        return
    stored = spec.backend.vllm_backend
    if candidates is not None and stored in set(candidates):
        return
    raise MxRepackError(
        f"--moe-backend {requested} cannot serve this checkpoint: its experts are laid out for "
        f"{spec.backend.kernel} (target {spec.target}); leave the MoE backend at auto (it follows the stored layout), "
        "or repack with a target for that backend (`repack targets`)"
    )


def missing_kernels_hint(backend: ExpertBackend, major: int, present: Callable[[str], bool]) -> str:
    """What to add to vLLM's reason for refusing ``backend`` on a GPU of compute capability ``major`` when that GPU runs
    it but its FlashInfer kernels are not installed (``present``: vLLM's ``vllm.utils.flashinfer`` function of that
    name, called), else "". Without them vLLM says its kernel "does not support current device" and names the GPU, a
    GB10 included, where the kernels are what is missing; on another GPU (a Hopper) the GPU is the reason."""
    if backend.kernels_present is None or major not in backend.kernels_run_on:
        return ""
    try:
        if present(backend.kernels_present):
            return ""
    except Exception:  # noqa: BLE001 - a vLLM without that function: vLLM's own reason stands alone
        return ""
    return (
        f" (vLLM finds no FlashInfer kernels for it: {backend.kernels_present}() is false; install them with "
        "`pip install flashinfer-cubin` or `vllm download-kernels`, or put nvcc and ninja on PATH for FlashInfer's JIT)"
    )


def check_kernel_device(device, what: str) -> None:
    """mxrepack's Triton kernels (the strided experts, the dense chunk tiles) run on CUDA GPUs, or under Triton's
    interpreter (``TRITON_INTERPRET=1``, the tests'): a layer ``what`` placed elsewhere (vLLM's CPU backend) is refused
    in one line at load, where Triton would fail at the first launch with "0 active drivers"."""
    from mxrepack.kernels.dequant_mxfp4 import interpreting

    if device.type != "cuda" and not interpreting():
        raise MxRepackError(
            f"{what} run on mxrepack's Triton kernels, which need a CUDA GPU; this engine put them on {device}"
        )


def check_vllm_version(version: str) -> None:
    """One line when the running vLLM is outside the versions the plugin is written for."""
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        raise MxRepackError(
            f"vLLM version {version!r} is not a release; the mxrepack plugin supports vLLM {VLLM_SUPPORTED_TEXT}"
        ) from None
    low, high = VLLM_SUPPORTED
    if not low <= (major, minor) < high:
        raise MxRepackError(
            f"vLLM {version} is not supported by the mxrepack plugin (supported: vLLM "
            f"{VLLM_SUPPORTED_TEXT}); install a supported vLLM or an mxrepack release for yours"
        )


def serving(target_layout: str | None, quantization_config: str, expert_options: dict | None = None) -> tuple[str, str]:
    """(how vLLM loads a target, the MoE kernel that computes with it), from its recipe's expert layout (and its
    options: strided's byte order ``wgmma`` runs on sm90 only, ``mma2`` on sm_12x and sm_8x) and its
    ``config.quantization_config`` mode."""
    if quantization_config == "remove":
        return "stock vLLM (unquantized BF16 MoE)", "vLLM's BF16 fused MoE"
    if quantization_config == "native":
        return (
            "stock vLLM (gpt-oss mxfp4; repacks at every start)",
            "vLLM's choice per GPU (Marlin, triton_kernels, ...)",
        )
    if quantization_config == "compressed-tensors":
        # stock vLLM 0.26-0.33's compressed-tensors MXFP4 MoE method has no expert biases; the plugin gives gpt-oss's
        # experts vLLM's own gpt-oss MXFP4 method instead
        return (
            'vLLM with the mxrepack plugin: pip install "mxrepack[vllm]" (stock vLLM cannot: its compressed-'
            "tensors MXFP4 MoE has no expert biases)",
            "vLLM's gpt-oss MXFP4 MoE (its backend per GPU, converted at load)",
        )
    backend = EXPERT_BACKENDS.get(target_layout or "")
    if backend is None:
        return "no vLLM path", "-"
    kernel, gpus = backend.kernel, backend.gpus
    order = (expert_options or {}).get("order", "rows") if target_layout == "strided" else "rows"
    if order == "wgmma":
        kernel, gpus = f"{kernel}, wgmma order", "sm90 (H100/H200) only"
    elif order == "mma2":
        kernel, gpus = f"{kernel}, mma2 order", "sm120/sm121 and sm80-sm89; not sm90/sm100"
    return 'vLLM with the mxrepack plugin: pip install "mxrepack[vllm]"', f"{kernel} [{gpus}]"


# How a chunk order's MoE compares with the rows order's on the GPUs whose MMA operand it is: wgmma on an H200
# (benchmarks/peers.py, 86bbbe0, docs/bench/peers_moe_h200_2026-11-29_86bbbe0.json: the rows order's time over the
# wgmma order's at T = 1 / 32 / 64 / 128 / 1024 / 4096 0.66 / 1.37 / 1.34 / 1.32 / 1.37 / 1.65x); mma2 on sm_12x's code
# path, an H100 under Triton's DISABLE_MMA_V3 (e7c9cdb, docs/bench/moe_sweep_mma2_mmav2_h100_2026-11-27_e7c9cdb.json:
# T = 16 / 64 / 512 / 4096 1.01 / 1.39 / 1.42 / 1.88x). Advised only on the GPUs those runs speak for (by compute
# capability major: sm_90; sm_12x and its Hopper stand-in): the mma2 order also runs on sm_8x, untimed there.
_CHUNK_ORDER_MAJORS = {"wgmma": (9,), "mma2": (9, 12)}
_CHUNK_ORDER_GAIN = {
    "wgmma": "1.3-1.65x faster than the rows order from 32 tokens on an H200 (at one token the rows order is faster)",
    "mma2": "1.4-1.9x faster than the rows order from 64 tokens (level at 16) on sm_12x's code path (timed on a "
    "Hopper, not a GB10)",
}


def order_advice(order: str, native: str, major: int) -> str | None:
    """The line the plugin logs when it serves strided experts in the rows order on a GPU (compute capability
    ``major``) whose MMA operand is a chunk order (``native``: :func:`mxrepack.kernels.dequant_mxfp4.native_order`):
    that order, the built-in target that writes it and what it gained where it was timed; None where the checkpoint's
    order is already the GPU's, no chunk order runs, or none was timed on this kind of GPU (sm_8x)."""
    if order != "rows" or major not in _CHUNK_ORDER_MAJORS.get(native, ()):
        return None
    target = next(
        r.name for r in list_recipes() if r.expert_layout == "strided" and r.expert_options.get("order") == native
    )
    return (
        f"mxrepack: these strided experts are in the rows order; this GPU's MMA reads the {native} order, "
        f"{_CHUNK_ORDER_GAIN[native]} (docs/PERF.md): for a server, repack with --target {target}"
    )


def _known_dense_kernel(value: str, named: str) -> str:
    """``value`` if it names a dense kernel, else one line: where it was read (``named``, the text before the value)
    and the choices."""
    if value not in DENSE_KERNELS:
        raise MxRepackError(f"{named}{value!r}: expected one of {', '.join(DENSE_KERNELS)}")
    return value


def dense_kernel(environ: Mapping[str, str] | None = None) -> str:
    """Which kernel the plugin runs MXFP4 dense layers on: ``$MXREPACK_DENSE_KERNEL`` (``marlin``, the default, or
    ``mxrepack``), read when vLLM builds the quant config; anything else is refused in one line."""
    value = (os.environ if environ is None else environ).get(DENSE_KERNEL_ENV, "").strip().lower()
    return _known_dense_kernel(value, f"{DENSE_KERNEL_ENV}=") if value else DENSE_KERNEL_DEFAULT


def chosen_dense_kernel(quantization_config: Mapping, environ: Mapping[str, str] | None = None) -> str:
    """The dense kernel of one engine: the one the process that built vLLM's config recorded in its
    ``quantization_config`` (``dense_kernel``; workers may not see that process's environment: vLLM's Ray executor
    passes on only its own prefixes), else :func:`dense_kernel`. The record is also what keys vLLM's compile cache to
    the choice (:meth:`mxrepack.serve.vllm.config.MxRepackConfig.maybe_update_config`)."""
    recorded = quantization_config.get("dense_kernel")
    if recorded is None:
        return dense_kernel(environ)
    return _known_dense_kernel(recorded, "quantization_config.dense_kernel is ")


# The plugin's own reader (mxrepack.serve.vllm.loader), offered as an option: measured on vLLM 0.26 only (H100, sm80)
FAST_LOAD_FLAG = "--load-format mxrepack"
FAST_LOAD_WHY = (
    "the plugin's reader (threads, page-locked staging), optional; on an H100 with vLLM 0.26 the weight phase took "
    "0.39x stock's (median of 4, docs/SERVING.md), not yet run on vLLM 0.33"
)


# Where each chunk order's dense tiles run (mxrepack.kernels.linear_mxfp4): wgmma needs sm_90's warpgroup MMA
DENSE_ORDER_GPUS = {"wgmma": "sm90 (H100/H200) only", "mma2": "sm120/sm121 and sm80-sm89; not sm90/sm100"}


# what vLLM (0.26-0.33) picks for a compressed-tensors checkpoint's dense layers: its own compressed-tensors
# integration, not the plugin (read from both versions' scheme selection and kernel lists; not run on a GPU)
CT_DENSE_SCHEMES = {
    "mxfp4": "vLLM's compressed-tensors MXFP4 linear (Marlin below sm100)",
    "mxfp8": "vLLM's compressed-tensors MXFP8 linear (CompressedTensorsW8A8Mxfp8: Marlin, weight-only, on sm_8x/sm_90; "
    "FlashInfer with activations quantized to MXFP8 on sm_100 and sm_12x)",
}


def dense_serving(dense_format: str, quantization_config: str, dense_order: str = "rows") -> str | None:
    """How a target's quantized dense layers are served: under ``quant_method: mxrepack`` the plugin's MXFP4 kernels
    (values in a chunk order, ``dense_order``, are read by mxrepack's tiles alone; in the rows order the engine
    chooses), under ``compressed-tensors`` vLLM's own scheme for the format; None elsewhere."""
    if quantization_config == "compressed-tensors" and dense_format in CT_DENSE_SCHEMES:
        return f"dense q/k/v/o: {CT_DENSE_SCHEMES[dense_format]}"
    if dense_format != "mxfp4" or quantization_config != QUANT_METHOD:
        return None
    if dense_order != "rows":
        gpus = DENSE_ORDER_GPUS.get(dense_order, "see docs/SERVING.md")  # an order a newer mxrepack wrote
        return (
            f"dense MXFP4 kernel: mxrepack's Triton chunk tiles (mxrepack.kernels.linear_mxfp4, {dense_order} order) "
            f"[{gpus}]; fixed by the stored order ({DENSE_KERNEL_ENV} does not apply)"
        )
    return (
        f"dense MXFP4 kernel: {DENSE_KERNELS[DENSE_KERNEL_DEFAULT]}; {DENSE_KERNEL_ENV}=mxrepack runs "
        "mxrepack's Triton kernels on the same bytes (opt-in: no lead over Marlin in decode speed yet, docs/SERVING.md)"
    )


def serve_refusal(config: dict) -> str | None:
    """Why the vLLM plugin would refuse an output with this ``config.json`` (its one-line reason), or None. A recipe can
    write what no engine serves (MXFP8 dense layers; BF16 experts beside MXFP4 dense ones, whose config then names
    ``quant_method: mxrepack``, so stock transformers refuses it too): ``repack`` and the model card say so, instead of
    a ``vllm serve`` line that fails."""
    qc = config.get("quantization_config")
    if not isinstance(qc, dict) or qc.get("quant_method") != QUANT_METHOD:
        return None
    try:
        ServeSpec.from_config(config)
    except MxRepackError as e:
        return str(e)
    return None


UNSERVED_HOW = "mxrepack's torch runner reads it: repack eval logits, eval gpqa --local, eval serve"


def serve_hint(
    out: str | Path,
    target_layout: str | None,
    quantization_config: str,
    expert_options: dict | None = None,
    dense_format: str = "bf16",
    dense_order: str = "rows",
    refusal: str | None = None,
) -> list[str]:
    """The lines ``repack`` prints after a conversion: how to serve the output with vLLM, or (``refusal``, from
    :func:`serve_refusal`) why no engine does."""
    if refusal:
        return [f"serve: no engine serves this output: {refusal}", f"       {UNSERVED_HOW}"]
    how, kernel = serving(target_layout, quantization_config, expert_options)
    plugin = quantization_config in ("mxrepack", "compressed-tensors")  # stock vLLM serves the others
    lines = ['pip install "mxrepack[vllm]"   (the vLLM plugin; vLLM ' + VLLM_SUPPORTED_TEXT + ")"] if plugin else []
    lines.append(
        f"vllm serve {out}"
        + ("   (no --quantization needed: config.json names the method)" if quantization_config == "mxrepack" else "")
    )
    lines.append(f"MoE kernel: {kernel}; one GPU (tensor parallelism 1)")
    backend = EXPERT_BACKENDS.get(target_layout or "")
    if quantization_config == "mxrepack" and backend is not None and not backend.ran_here:
        lines.append(
            "that MoE kernel has not run on a GPU in mxrepack's checks (no such GPU lent): the stored experts equal "
            "vLLM's own conversion for it, byte for byte"
        )
    dense = dense_serving(dense_format, quantization_config, dense_order)
    if dense:
        lines.append(dense)
    if plugin:
        lines.append(f"{FAST_LOAD_FLAG}: {FAST_LOAD_WHY}")
    return ["serve: " + lines[0], *("       " + line for line in lines[1:])]


def hub_snapshot_identity(
    model_id: str, revision: str | None = None, config_commit: str | None = None, cache_dir: str | Path | None = None
) -> str | None:
    """For a Hub model id: ``hub:<commit>``, the commit of the snapshot vLLM read the config from, or None where it
    is not known. A commit's files never change, so this names the weights as :func:`weights_identity` names a
    folder's: a repo pushed again under the same name and an unpinned revision gets a new commit, where vLLM's compile
    cache would otherwise hash only the name and the revision. First the commit the config records
    (``config_commit``: transformers before 5.20 keeps it as ``_commit_hash``), then the revision's own (vLLM 0.33
    passes a revision resolved to its commit; 0.26 passes none), then the local Hugging Face cache's snapshot holding
    ``config.json`` for the revision or the default branch (no network)."""
    for commit in (config_commit, getattr(revision, "resolved", None), revision):
        if isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40}", commit):
            return f"hub:{commit}"
    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(model_id, "config.json", cache_dir=cache_dir, revision=revision)
    except Exception:  # noqa: BLE001 - not a repo id, or an unreadable cache: an engine must start
        return None
    return f"hub:{Path(path).parent.name}" if isinstance(path, str) else None


def weights_identity(model_dir: str | Path) -> str:
    """A short name for the weights in ``model_dir`` that changes when they do: the mxrepack manifest's digest (which
    covers every file's sha256), else a digest of the safetensors files' names, sizes and modification times.
    Recorded where vLLM hashes its torch.compile cache, since a cached graph keeps the values a layer's ``apply`` read
    from its weights at trace time (the dense op's ``fold_scale``): another checkpoint written to the same folder
    with the same config must not reuse it. Reads no tensor data; raises nothing for unreadable files (an engine must
    start)."""
    import hashlib

    from mxrepack.repack.output import DIGEST_KEY, load_manifest

    model_dir = Path(model_dir)
    try:
        digest = load_manifest(model_dir).get(DIGEST_KEY)
    except (MxRepackError, OSError):  # none, unreadable or no mxrepack manifest: named by the files instead
        digest = None
    if isinstance(digest, str):
        return f"manifest:{digest[:16]}"
    stats = []
    for path in sorted(model_dir.glob("*.safetensors")):
        try:
            st = path.stat()
            stats.append((path.name, st.st_size, st.st_mtime_ns))
        except OSError:  # a dangling link (a Hub cache's) or a file gone meanwhile: vLLM reads the index, not this
            stats.append((path.name, None, None))
    return "files:" + hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16]
