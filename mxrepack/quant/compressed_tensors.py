"""compressed-tensors interop: the ``quantization_config`` of a target checkpoint, written through the
library's own classes, and decompression of our tensors through the library (for round-trip proofs).

Config (formats.md 4.1): ``quant_method: compressed-tensors``, ``quantization_status: compressed``,
one config group per stored format (experts MXFP4 ``mxfp4-pack-quantized``; dense layers MXFP4 or
MXFP8 ``mxfp8-quantized``), ``format`` the single group format or ``mixed-precision``, ``ignore``
listing the Linear modules left BF16 (lm_head, routers, unquantized attention), plus the
``version`` and ``transform_config`` keys llm-compressor's writer adds.
"""

from __future__ import annotations

import re

import torch

from mxrepack.errors import MxRepackError

EXPERT_TARGET = r"re:.*mlp\.experts\.\d+\.(gate|up|down)_proj$"
FORMAT_OF = {"mxfp4": "mxfp4-pack-quantized", "mxfp8": "mxfp8-quantized"}
PRESET_OF = {"mxfp4": "MXFP4A16", "mxfp8": "MXFP8A16"}
TESTED = ((0, 19), (0, 22))  # [from, below): the versions whose bytes and config the tests compare with


def require():
    """The compressed-tensors library, or one line saying how to get a version this target is tested with (it is an
    extra: vLLM pins 0.17, and mxrepack's vLLM plugin must install beside that)."""
    try:
        import compressed_tensors
    except ImportError:
        raise MxRepackError(
            "the compressed-tensors target needs the compressed-tensors library: "
            'pip install "mxrepack[compressed-tensors]"'
        ) from None
    try:
        version = tuple(int(x) for x in compressed_tensors.__version__.split(".")[:2])
    except ValueError:
        version = TESTED[0]
    if not TESTED[0] <= version < TESTED[1]:
        raise MxRepackError(
            f"compressed-tensors {compressed_tensors.__version__} is installed; the compressed-tensors "
            'target is tested with 0.19 to 0.21: pip install "mxrepack[compressed-tensors]" (in an '
            "environment without vLLM, which pins 0.17)"
        )
    return compressed_tensors


def scheme(fmt: str, targets: list[str]):
    require()
    from compressed_tensors.quantization import preset_name_to_scheme

    s = preset_name_to_scheme(PRESET_OF[fmt], targets)
    s.format = FORMAT_OF[fmt]
    return s


def check_fused_qkv(modules: list[str]) -> None:
    """vLLM fuses q/k/v into one QKVParallelLinear: the three must share a scheme (formats.md 5b)."""
    layers: dict[str, set[str]] = {}
    for m in modules:
        hit = re.fullmatch(r"(model\.layers\.\d+)\.self_attn\.([qkv])_proj", m)
        if hit:
            layers.setdefault(hit[1], set()).add(hit[2])
    for layer, parts in sorted(layers.items()):
        if parts != {"q", "k", "v"}:
            raise MxRepackError(
                f"{layer}.self_attn: only {'/'.join(sorted(parts))}_proj selected; q, k and v are one "
                "fused Linear in vLLM and must be quantized together (use 'qkv')"
            )


def quantization_config(
    experts_mxfp4: bool, dense_format: str | None, dense_modules: list[str], all_linear: list[str]
) -> dict:
    """The ``quantization_config`` dict, built and serialized by compressed-tensors' QuantizationConfig.

    ``dense_modules``: the dense Linear modules quantized (``dense_format``); ``all_linear``: every
    dense Linear module of the model (the rest go to ``ignore``)."""
    compressed_tensors = require()
    from compressed_tensors.quantization import QuantizationConfig

    groups, formats = {}, []
    if experts_mxfp4:
        groups[f"group_{len(groups)}"] = scheme("mxfp4", [EXPERT_TARGET])
        formats.append(FORMAT_OF["mxfp4"])
    if dense_format and dense_modules:
        check_fused_qkv(dense_modules)
        groups[f"group_{len(groups)}"] = scheme(dense_format, sorted(dense_modules))
        formats.append(FORMAT_OF[dense_format])
    if not groups:
        raise MxRepackError("compressed-tensors config: nothing is quantized")
    chosen = set(dense_modules)
    ignore = [m for m in all_linear if m not in chosen]
    fmt = formats[0] if len(set(formats)) == 1 else "mixed-precision"
    config = QuantizationConfig(config_groups=groups, format=fmt, quantization_status="compressed", ignore=ignore)
    out = config.to_dict()
    out["version"] = compressed_tensors.__version__
    out["transform_config"] = {}
    return out


def decompress(fmt: str, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """One Linear's stored tensors (``weight_packed``/``weight`` + ``weight_scale``) -> BF16 weight,
    through compressed-tensors' registered compressor for ``fmt``."""
    from compressed_tensors.compressors import BaseCompressor

    compressor = BaseCompressor.get_value_from_registry(FORMAT_OF[fmt])
    out = compressor.decompress(dict(tensors), scheme(fmt, ["Linear"]))
    return out["weight"]
