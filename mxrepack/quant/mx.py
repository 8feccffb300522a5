"""The MX codec: E2M1 (FP4) and E4M3 (FP8) elements with shared E8M0 scales, group 32.

Encoding facts (OCP Microscaling Formats v1.0; gpt-oss ``weights.py``; transformers
``integrations/mxfp4.py``):

* E2M1 code -> value: bit 3 is the sign, bits 0-2 index ``0, .5, 1, 1.5, 2, 3, 4, 6``.
* Two codes per byte: the LOW nibble is the even element (2j), the HIGH nibble the odd one (2j+1).
* E8M0 scale byte ``s`` means ``2**(s - 127)``; byte 255 is NaN and never valid in a checkpoint.
* A group (block) is 32 consecutive elements along the input (last) dimension: 16 packed bytes.

Scale rules for quantization (``scale_rule``):

* ``"ocp"`` -- the OCP MX spec rule: ``X = 2**(floor(log2(amax)) - emax_elem)`` with
  ``emax_elem = 2`` for E2M1 (max 6.0) and ``8`` for E4M3 (max 448.0). Elements are
  ``v / X`` rounded to nearest, ties to even, saturating at the element max.
* ``"compressed-tensors"`` -- the rule compressed-tensors' ``generate_mx_scales`` uses: ``amax`` is
  first rounded to a power of two, rounding UP when the mantissa's fraction is >= 0.75 (FP4/FP8 use
  the E2M1 mantissa width), then the same ``- emax_elem``. Fewer groups saturate; bit-identical to the
  library for bf16 weights (tested against the installed package).

An all-zero group gets scale byte 0 (2**-127) under both rules; its elements are +0. A negative value
that rounds to zero is written -0 (code 8), as IEEE rounding and compressed-tensors do.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from mxrepack import native
from mxrepack.errors import MxRepackError

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
MX_GROUP = 32
BYTES_PER_GROUP = MX_GROUP // 2
E8M0_BIAS = 127
E8M0_NAN = 255
FP4_MAX = 6.0
FP8_E4M3_MAX = 448.0
SCALE_RULES = ("ocp", "compressed-tensors")
# floor(log2(element max)): the exponent of the largest element value.
_ELEM_EMAX = {"fp4": 2, "fp8": 8}


def _bits16(values: list[float], dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).view(torch.int16).to(torch.int32) & 0xFFFF


def _pair_lut(dtype: torch.dtype) -> torch.Tensor:
    """byte -> (value of low nibble, value of high nibble), as one integer holding both in memory order.

    Viewing the gathered integers as ``dtype`` yields the elements already interleaved (even, odd), so
    dequantization is one gather plus one multiply, with no nibble arithmetic on the hot path.
    """
    byte = torch.arange(256)
    lo, hi = (byte & 15).tolist(), (byte >> 4).tolist()
    if dtype in (torch.bfloat16, torch.float16):
        lo_bits = _bits16([FP4_VALUES[i] for i in lo], dtype)
        hi_bits = _bits16([FP4_VALUES[i] for i in hi], dtype)
        return (lo_bits | (hi_bits << 16)).to(torch.int32)  # little-endian: low half first
    if dtype == torch.float32:
        lo_bits = torch.tensor([FP4_VALUES[i] for i in lo], dtype=torch.float32).view(torch.int32)
        hi_bits = torch.tensor([FP4_VALUES[i] for i in hi], dtype=torch.float32).view(torch.int32)
        return (lo_bits.to(torch.int64) & 0xFFFFFFFF) | (hi_bits.to(torch.int64) << 32)
    raise ValueError(f"unsupported dequantization dtype {dtype}")


def _quad_lut(dtype: torch.dtype) -> np.ndarray:
    """uint16 (two packed bytes) -> four 16-bit values in one int64: half as many gathers as bytes.

    Gathers dominate dequantization on CPU; numpy's fancy indexing over a 512 KiB table runs about
    three times faster than a byte-wise torch gather (measured on the 2-core dev machine).
    """
    pair = _pair_lut(dtype).numpy().astype(np.uint32).astype(np.uint64)
    index = np.arange(65536)
    return (pair[index & 255] | (pair[index >> 8] << np.uint64(32))).view(np.int64)


_LUTS: dict[torch.dtype, object] = {}


def _lut(dtype: torch.dtype):
    if dtype not in _LUTS:
        _LUTS[dtype] = _quad_lut(dtype) if dtype in (torch.bfloat16, torch.float16) else _pair_lut(dtype)
    return _LUTS[dtype]


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., n]`` -> E2M1 codes uint8 ``[..., 2n]`` (low nibble first)."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).flatten(-2)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes uint8 ``[..., 2n]`` -> uint8 ``[..., n]`` (even element in the low nibble)."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4 needs an even last dimension, got shape {tuple(codes.shape)}")
    pairs = codes.to(torch.uint8).unflatten(-1, (-1, 2))
    return pairs[..., 0] | (pairs[..., 1] << 4)


def check_e8m0(scales: torch.Tensor, where: str) -> None:
    """Refuse E8M0 byte 255 (NaN): it has no meaning as a weight scale."""
    if scales.dtype != torch.uint8:
        raise MxRepackError(f"{where}: E8M0 scales must be uint8, got {scales.dtype}")
    if scales.numel() and int(scales.max()) == E8M0_NAN:  # a max-reduction is several times faster than ==/any
        count = int((scales == E8M0_NAN).sum())
        raise MxRepackError(f"{where}: {count} E8M0 scale byte(s) are 255 (NaN); expected 0..254")


def e8m0_to_float(scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """E8M0 bytes -> exact powers of two ``2**(s-127)`` (byte 0 is the subnormal 2**-127)."""
    s = scales.to(torch.int32)
    bits = torch.where(s > 0, s << 23, torch.full_like(s, 1 << 22))  # 2**-127 = fp32 subnormal
    return bits.view(torch.float32).to(dtype)


def dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16, transpose: bool = False
) -> torch.Tensor:
    """MXFP4 -> float, bit-identical to ``transformers...convert_moe_packed_tensors`` (before its transpose).

    ``blocks`` is uint8 ``[..., G, 16]`` (checkpoint form) or ``[..., G*16]`` (flattened);
    ``scales`` is uint8 ``[..., G]``. Returns ``[..., G*32]`` in ``dtype``; with ``transpose``,
    ``[..., G*32, R]`` (the last two dims swapped, contiguous: transformers' ``[in, out]`` expert weights).
    Every value is ``code * 2**k``: exact in bf16/fp32 wherever the format can hold it at all.

    BF16 on the CPU runs one compiled pass (:mod:`mxrepack.native`: lookup, scale, and the transpose in
    L1-sized tiles) where the library is built; elsewhere, and for other dtypes, its numpy/torch twin below.
    """
    if blocks.dim() == scales.dim():
        blocks = blocks.unflatten(-1, (-1, BYTES_PER_GROUP))
    if tuple(blocks.shape[:-1]) != tuple(scales.shape) or blocks.shape[-1] != BYTES_PER_GROUP:
        raise ValueError(f"blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}")
    if transpose and blocks.dim() < 3:
        raise ValueError(f"transpose needs rows of groups, [..., R, G, 16]; got blocks {tuple(blocks.shape)}")
    if dtype == torch.bfloat16 and blocks.device.type == "cpu" and (lib := native.library()) is not None:
        return _dequantize_bf16_native(lib, blocks, scales, transpose)
    lut = _lut(dtype)
    if isinstance(lut, np.ndarray):
        quads = lut[blocks.contiguous().numpy().view(np.uint16)]  # [..., G, 8] four values each
        values = torch.from_numpy(quads).view(dtype)
    else:
        values = lut[blocks.to(torch.int32)].contiguous().view(dtype)
    values = values.reshape(*blocks.shape[:-1], MX_GROUP)
    values = values * e8m0_to_float(scales, dtype).unsqueeze(-1)
    values = values.flatten(-2)
    return values.transpose(-1, -2).contiguous() if transpose else values


def _dequantize_bf16_native(lib, blocks: torch.Tensor, scales: torch.Tensor, transpose: bool) -> torch.Tensor:
    """:func:`dequantize_mxfp4` to BF16 by the compiled loops, rows (or 32-row tiles) split over the cores."""
    G = blocks.shape[-2]
    b = blocks.contiguous().numpy()
    s = scales.contiguous().numpy()
    if transpose:
        *lead, R = blocks.shape[:-2]
        matrices, tiles = int(np.prod(lead)), -(-R // 32)
        out = np.empty((matrices, 32 * G, R), np.uint16)
        map_row_blocks(
            matrices * tiles,
            lambda u0, u1: lib.mxfp4_bf16_cols(native.ptr(b), native.ptr(s), native.ptr(out), u0, u1, R, G),
            min_rows=4,
        )
        shape = (*lead, 32 * G, R)
    else:
        rows = int(np.prod(blocks.shape[:-2]))
        out = np.empty((rows, 32 * G), np.uint16)
        map_row_blocks(
            rows,
            lambda r0, r1: lib.mxfp4_bf16_rows(native.ptr(b), native.ptr(s), native.ptr(out), r0, r1, G),
            min_rows=64,
        )
        shape = (*blocks.shape[:-2], 32 * G)
    return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16).reshape(shape)  # BF16 bits


def dequantize_mxfp8(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """MXFP8 (E4M3 elements ``[..., K]``, E8M0 scales ``[..., K/32]``) -> float ``[..., K]``."""
    v = values.view(torch.float8_e4m3fn).to(torch.float32).unflatten(-1, (-1, MX_GROUP))
    return (v * e8m0_to_float(scales).unsqueeze(-1)).flatten(-2).to(dtype)


class NonFiniteError(MxRepackError):
    """A group to quantize holds NaN or Inf: ``count`` such values, the first in ``row`` (leading dims flattened)."""

    def __init__(self, count: int, row: int):
        super().__init__(f"{count} NaN/Inf value(s) (first in row {row})")
        self.count, self.row = count, row


def _group_amax(w: torch.Tensor) -> torch.Tensor:
    """Per-group absolute maxima; raises :class:`NonFiniteError` when a group holds NaN or Inf (both
    survive the max, so the whole input is checked at the cost of a check on the maxima)."""
    if w.shape[-1] % MX_GROUP:
        raise MxRepackError(f"last dimension {w.shape[-1]} is not a multiple of {MX_GROUP}")
    if w.dtype == torch.bfloat16:
        # |w| orders like its bits with the sign cleared (NaN above Inf): one integer pass, no abs copy.
        amax = (w.view(torch.int16) & 0x7FFF).unflatten(-1, (-1, MX_GROUP)).amax(-1).view(torch.bfloat16)
    else:
        amax = w.unflatten(-1, (-1, MX_GROUP)).abs().amax(-1)
    if amax.numel() and not bool(torch.isfinite(amax).all()):
        bad = ~torch.isfinite(w.reshape(-1, w.shape[-1]))
        raise NonFiniteError(int(bad.sum()), int(bad.any(-1).nonzero()[0, 0]))
    return amax


def mx_scale_exponents(amax: torch.Tensor, element: str, rule: str = "ocp") -> torch.Tensor:
    """Per-group unbiased scale exponents (int32) from group absolute maxima.

    ``element`` is ``"fp4"`` or ``"fp8"``; ``rule`` one of :data:`SCALE_RULES` (module docstring).
    """
    if rule not in SCALE_RULES:
        raise MxRepackError(f"unknown scale rule {rule!r}; expected one of {', '.join(SCALE_RULES)}")
    a = amax.to(torch.float32)
    bits = a.view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127  # floor(log2(a)) for normal a
    if rule == "compressed-tensors":
        # Round amax to a power of two, up when the mantissa fraction is >= 0.75 (E2M1 mantissa width):
        # the bf16 bit trick of compressed-tensors' round_to_power_2, done on fp32 bits.
        exponent = exponent + ((bits & 0x7FFFFF) >= 0x600000).to(torch.int32)
    exponent = exponent - _ELEM_EMAX[element]
    zero = ((bits >> 23) & 0xFF) == 0  # zero (or subnormal) group max: smallest scale
    exponent = torch.where(zero, torch.full_like(exponent, -127), exponent)
    return exponent.clamp(-127, 127)


def _round_e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Round scaled magnitudes to E2M1 codes (nearest, ties to even code, saturating at 6)."""
    a = x.abs()
    # Boundaries between grid values 0,.5,1,1.5,2,3,4,6. At a tie the even code wins: ties at
    # .25/1.25/2.5/5 round down, ties at .75/1.75/3.5 round up.
    code = (a > 0.25).to(torch.uint8)
    code += a >= 0.75
    code += a > 1.25
    code += a >= 1.75
    code += a > 2.5
    code += a >= 3.5
    code += a > 5.0
    # The sign follows IEEE rounding (a tiny negative becomes -0, code 8) while an exact -0.0 input is
    # written +0: the same bytes compressed-tensors' cast_to_fp4 produces.
    sign = (x < 0).to(torch.uint8) << 3
    return code | sign


def _scaled_groups(w: torch.Tensor, exp: torch.Tensor) -> torch.Tensor:
    """``w / 2**exp`` per group of 32, exact (a power-of-two multiply, or a divide below 2**-126)."""
    scaled = w.to(torch.float32).unflatten(-1, (-1, MX_GROUP))
    inv = e8m0_to_float((-exp + E8M0_BIAS).clamp(0, 254).to(torch.uint8))
    small = exp < -126  # 2**-exp overflows fp32: divide by the (subnormal) scale instead
    if bool(small.any()):
        return torch.where(
            small.unsqueeze(-1),
            scaled / e8m0_to_float((exp + E8M0_BIAS).to(torch.uint8)).unsqueeze(-1),
            scaled * inv.unsqueeze(-1),
        )
    return scaled * inv.unsqueeze(-1)


_FP4_MAGNITUDES = torch.tensor(FP4_VALUES[:8])


def _fp4_group_error(scaled: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Squared error per group, in units of the scale, of E2M1 ``codes`` for ``scaled`` values."""
    values = _FP4_MAGNITUDES[(codes & 7).long()] * torch.where(codes >= 8, -1.0, 1.0)
    return (values - scaled).square().sum(-1)


@functools.cache
def _bf16_code_luts() -> tuple[np.ndarray, np.ndarray]:
    """bf16 bits -> E2M1 code (low nibble) and the same code in the high nibble: 64 KiB tables."""
    values = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    codes = _round_e2m1_codes(values).numpy()
    return codes, codes << 4


@functools.cache
def _gather_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="mxrepack-gather")


def map_row_blocks(rows: int, work, min_rows: int = 1) -> None:
    """Run ``work(start, stop)`` over ``range(rows)`` in one block per core (at least ``min_rows`` rows each)
    on a shared thread pool: numpy's gathers release the GIL, so table lookups use every core."""
    step = max(min_rows, -(-rows // (os.cpu_count() or 1)))
    list(_gather_pool().map(lambda r: work(r, min(rows, r + step)), range(0, rows, step)))


def _pack_bf16_scaled(scaled: torch.Tensor) -> torch.Tensor:
    """bf16 ``[..., K]`` already divided by its scales -> packed E2M1 ``[..., K/2]`` by table lookup.

    Rounding to the 8-value grid is a function of the 16 input bits, so one gather per element
    replaces the comparisons against the 7 boundaries (4x faster on the 2-core dev machine), and the
    even/odd tables write the packed byte directly. Rows are split over threads (:func:`map_row_blocks`).
    """
    lo, hi = _bf16_code_luts()
    bits = scaled.contiguous().view(torch.int16).numpy().view(np.uint16).reshape(-1, scaled.shape[-1])
    out = np.empty((bits.shape[0], bits.shape[1] // 2), dtype=np.uint8)

    def work(r0: int, r1: int) -> None:
        block = out[r0:r1]
        np.take(lo, bits[r0:r1, 0::2], out=block, mode="clip")  # indices < 65536: clip = no check, no buffer
        block |= np.take(hi, bits[r0:r1, 1::2], mode="clip")

    map_row_blocks(bits.shape[0], work)
    return torch.from_numpy(out).reshape(*scaled.shape[:-1], -1)


def quantize_mxfp4(w: torch.Tensor, scale_rule: str = "ocp", search: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """float ``[..., K]`` -> (packed uint8 ``[..., K/2]``, E8M0 uint8 ``[..., K/32]``).

    ``search``: per group, also try the next larger scale (``e + 1``) and keep whichever gives the
    lower squared error. The rule's scale clips groups whose max rounds above 6; one step up halves
    the resolution but removes the clipping, which wins for groups dominated by one outlier.

    BF16 weights (the checkpoint's) take a table path: ``w / 2**e`` is exact in bf16 (a power-of-two
    scale), so the code is a lookup of its bits. It writes the same bytes as the float32 path except
    for a negative value more than 2**-133 below its scale, which underflows to -0 in bf16 and is
    written +0 instead of -0 (both decode to zero).
    """
    exp = mx_scale_exponents(_group_amax(w), "fp4", scale_rule)
    if w.dtype == torch.bfloat16 and not search and bool((exp >= -127).all()):
        inv = e8m0_to_float((E8M0_BIAS - exp).clamp(0, 254).to(torch.uint8), torch.bfloat16)
        scaled = (w.unflatten(-1, (-1, MX_GROUP)) * inv.unsqueeze(-1)).flatten(-2)
        return _pack_bf16_scaled(scaled), (exp + E8M0_BIAS).to(torch.uint8)
    scaled = _scaled_groups(w, exp)
    codes = _round_e2m1_codes(scaled)
    if search:
        up = (exp + 1).clamp(max=127)
        scaled_up = scaled * 0.5
        codes_up = _round_e2m1_codes(scaled_up)
        # Errors in the units of the original scale: the candidate's are 4x (its scale is 2x).
        better = _fp4_group_error(scaled_up, codes_up) * 4 < _fp4_group_error(scaled, codes)
        better &= exp < 127
        codes = torch.where(better.unsqueeze(-1), codes_up, codes)
        exp = torch.where(better, up, exp)
    return pack_fp4(codes.flatten(-2)).contiguous(), (exp + E8M0_BIAS).to(torch.uint8)


def quantize_mxfp8(w: torch.Tensor, scale_rule: str = "ocp", search: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """float ``[..., K]`` -> (float8_e4m3fn ``[..., K]``, E8M0 uint8 ``[..., K/32]``); saturating.

    ``search`` as for :func:`quantize_mxfp4` (try ``e + 1``, keep the lower squared error).
    """
    exp = mx_scale_exponents(_group_amax(w), "fp8", scale_rule)
    scaled = _scaled_groups(w, exp)
    values = scaled.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    if search:
        scaled_up = scaled * 0.5
        values_up = scaled_up.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
        err = (values.to(torch.float32) - scaled).square().sum(-1)
        err_up = (values_up.to(torch.float32) - scaled_up).square().sum(-1) * 4
        better = (err_up < err) & (exp < 127)
        values = torch.where(better.unsqueeze(-1), values_up, values)
        exp = torch.where(better, exp + 1, exp)
    return values.flatten(-2), (exp + E8M0_BIAS).to(torch.uint8)
