"""Quantization: the MX codec (MXFP4/MXFP8, E8M0 scales, group 32) and quantizers built on it."""

from mxrepack.quant.mx import (
    BYTES_PER_GROUP,
    E8M0_BIAS,
    FP4_VALUES,
    MX_GROUP,
    SCALE_RULES,
    check_e8m0,
    dequantize_mxfp4,
    dequantize_mxfp8,
    e8m0_to_float,
    mx_scale_exponents,
    pack_fp4,
    quantize_mxfp4,
    quantize_mxfp8,
    unpack_fp4,
)

__all__ = [
    "BYTES_PER_GROUP",
    "E8M0_BIAS",
    "FP4_VALUES",
    "MX_GROUP",
    "SCALE_RULES",
    "check_e8m0",
    "dequantize_mxfp4",
    "dequantize_mxfp8",
    "e8m0_to_float",
    "mx_scale_exponents",
    "pack_fp4",
    "quantize_mxfp4",
    "quantize_mxfp8",
    "unpack_fp4",
]
