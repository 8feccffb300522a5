"""``triton-hopper``: OpenAI triton_kernels ``matmul_ogs`` MXFP4 weights as vLLM hands them to it on Hopper.

Pinned to the triton_kernels that vLLM 0.33.0 vendors (``vllm/third_party/triton_kernels``, the
``(cls, kwargs)`` layout API) and to vLLM's ``mxfp4_utils._swizzle_mxfp4`` call: values are the
checkpoint ``[E, N, K/2]`` viewed as ``[E, K/2, N]`` with the MX axis on K, scales ``[E, K/32, N]``.
Byte-exact against golden ``triton_kernels.safetensors`` for every value/scale layout below; stored
tensors are the storage bytes in memory order (layouts.md 3.3).

Value layouts (``value=``):

* ``hopper`` -- ``HopperMXValueLayout(mx_axis=1)`` (mma v3): rows N padded to 16, packed K bytes to
  32; each thread's bytes of 4 mma tiles along K made contiguous (``[E, N/4, 4*K/2]``), then every
  32-bit word's eight nibbles bit-twiddled so a bf16 upcast is a mask and a shift;
* ``plain`` -- the checkpoint bytes unchanged (triton_kernels' ``StridedLayout``); ``blackwell`` -- K bytes
  zero-padded to 128.

Scale layouts (``scale=``): ``hopper`` -- ``HopperMXScaleLayout(mx_axis=1, num_warps)``: N padded to
``32 * num_warps``, K/32 to 2, tiles of ``(2, warps, 2, 8) x (K/64, 2)`` reordered to
``[E, N/32, 32*K/32]``; ``plain`` -- unchanged (``StridedLayout``); ``blackwell`` -- the 128x4 swizzle with N
padded to 128 and K/32 to 8, ``[E, N/128, K/128, 2, 256]`` (the golden's ``[1, E*N/128, ...]`` is the same bytes).

Not applied (the golden README says the same): vLLM's TRITON backend also zero-pads the intermediate
size to 64 (a no-op for gpt-oss, 2880 = 45 * 64) and, from vLLM PR #47303, the Hopper scale K/32 axis
to a multiple of 4. Gate/up rows stay interleaved (triton_kernels' fused swiglu reads pairs); biases are
float32, as vLLM holds them.
"""

from __future__ import annotations

import numpy as np
import torch

from mxrepack import native
from mxrepack.errors import MxRepackError
from mxrepack.layouts.base import (
    ExpertDims,
    ExpertLayout,
    OutputSpec,
    pad_rows_cols,
    round_up,
    swizzle_128x4,
    unswizzle_128x4,
)
from mxrepack.quant.mx import map_row_blocks

UPSTREAM = (
    "triton_kernels as vendored in vllm 0.33.0 (vllm/third_party/triton_kernels), via vllm mxfp4_utils._swizzle_mxfp4"
)
LAYOUT_NAMES = {
    "hopper": ("HopperMXValueLayout(mx_axis=1)", "HopperMXScaleLayout(mx_axis=1, num_warps={w})"),
    "plain": ("StridedLayout", "StridedLayout"),
    "blackwell": ("BlackwellMXValueLayout", "BlackwellMXScaleLayout"),
}
# Former option values. "strided" (triton_kernels' name for its unswizzled layout) was renamed "plain" because it
# read as mxrepack's own ``strided`` expert layout; recipes and manifests written with it still load.
OPTION_ALIASES = {"strided": "plain"}


# --- the Hopper value bit-twiddle ---------------------------------------------------------------
# In each little-endian 32-bit word of 4 bytes (8 FP4 codes, low nibbles = half 0, high nibbles =
# half 1), code j of a half (j = byte index) is spread over that half's 16 bits so that
# ``(word << 3j) & 0b1000000111000000`` leaves a bf16 with the code's sign and exponent/mantissa bits
# (j < 3); the fourth code fills the holes. Source bit -> destination bit, per half:
def _half_map(j: int) -> dict[int, int]:
    if j < 3:  # sign -> 15 - 3j, e/m bits 0..2 -> 6..8 shifted right by 3j
        return {3: 15 - 3 * j, 0: 6 - 3 * j, 1: 7 - 3 * j, 2: 8 - 3 * j}
    return {3: 14, 1: 10, 2: 11, 0: 13}


def _word_bit_perm() -> list[int]:
    dst = [0] * 32
    for j in range(4):
        for half in range(2):
            for b, d in _half_map(j).items():
                dst[8 * j + 4 * half + b] = 16 * half + d
    assert sorted(dst) == list(range(32))
    return dst


def _chunk_luts(dst: list[int], bits: int) -> np.ndarray:
    """A bit permutation of a 32-bit word as one table per source chunk of ``bits`` bits (``[32 // bits,
    2 ** bits]`` uint32), to OR: 16-bit chunks for the numpy path (two gathers per word, 256 KB tables that
    stay in L2), bytes for the native loop (four reads of 1 KB tables)."""
    luts = np.zeros((32 // bits, 1 << bits), dtype=np.uint32)
    v = np.arange(1 << bits, dtype=np.uint32)
    for h in range(32 // bits):
        for b in range(bits):
            luts[h] |= ((v >> b) & 1) << np.uint32(dst[bits * h + b])
    return luts


def _rotations(dst: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """A bit permutation of a 32-bit word as (rotations, masks), uint32 each: ``OR_g rotl(w, rot[g]) & mask[g]``,
    one pair per distance (mod 32) that some bit moves, for the SIMD loop (a rotate and a masked OR per pair)."""
    masks: dict[int, int] = {}
    for b, d in enumerate(dst):
        masks[(d - b) % 32] = masks.get((d - b) % 32, 0) | 1 << d
    return np.array(list(masks), dtype=np.uint32), np.array(list(masks.values()), dtype=np.uint32)


_TWIDDLE = _word_bit_perm()
_UNTWIDDLE = [_TWIDDLE.index(i) for i in range(32)]
_TWIDDLE_LUTS, _UNTWIDDLE_LUTS = _chunk_luts(_TWIDDLE, 16), _chunk_luts(_UNTWIDDLE, 16)
_TWIDDLE_BYTE_LUTS, _UNTWIDDLE_BYTE_LUTS = _chunk_luts(_TWIDDLE, 8).reshape(-1), _chunk_luts(_UNTWIDDLE, 8).reshape(-1)
_TWIDDLE_ROTATIONS, _UNTWIDDLE_ROTATIONS = _rotations(_TWIDDLE), _rotations(_UNTWIDDLE)


def _permute_word_bits(x: torch.Tensor, luts: np.ndarray) -> torch.Tensor:
    """Apply a 32-bit-word bit permutation to a uint8 tensor whose last dim is a multiple of 4."""
    h = x.contiguous().numpy().view(np.uint16).reshape(-1, 2)
    out = np.empty(h.shape[0], dtype=np.uint32)

    def work(i: int, j: int) -> None:
        w = np.take(luts[0], h[i:j, 0])
        w |= np.take(luts[1], h[i:j, 1])
        out[i:j] = w

    map_row_blocks(h.shape[0], work, min_rows=1 << 20)
    return torch.from_numpy(out.view(np.uint8).reshape(x.shape))


def _native_values(
    lib, fn: str, x: torch.Tensor, kb: int, luts: np.ndarray, rotations: tuple[np.ndarray, np.ndarray]
) -> torch.Tensor:
    """Run a native 16-row-block loop (``mxrepack_native.c``; its AVX-512 twin where :func:`native.simd`) over
    ``x``, blocks split over threads."""
    src = x.contiguous().numpy().reshape(-1)
    out = native.empty(src.size, np.uint8)
    block = 16 * kb
    if native.simd():
        fn, rot, mask = fn + "_simd", *rotations
        bits = (native.ptr(rot), native.ptr(mask), len(rot))
    else:
        bits = (native.ptr(luts),)
    call = getattr(lib, fn)

    def work(b0: int, b1: int) -> None:
        call(native.ptr(src[b0 * block :]), native.ptr(out[b0 * block :]), b1 - b0, kb, *bits)

    map_row_blocks(src.size // block, work, min_rows=64)
    return torch.from_numpy(out)


def twiddle_bits(x: torch.Tensor) -> torch.Tensor:
    return _permute_word_bits(x, _TWIDDLE_LUTS)


def untwiddle_bits(x: torch.Tensor) -> torch.Tensor:
    return _permute_word_bits(x, _UNTWIDDLE_LUTS)


# --- value layouts on checkpoint-order bytes [E, N, K/2] ----------------------------------------
def hopper_value_swizzle(w: torch.Tensor) -> torch.Tensor:
    """``[E, N, Kb]`` -> ``[E, N16/4, 4 * Kb32]`` (N padded to 16, Kb to 32 bytes).

    With ``n = 16 r + 8 w0 + 2 t0 + s0`` and ``kb = 32 c + 8 kt + 4 w1 + t1``, byte (n, kb) goes to
    row ``4 r + t0``, column ``128 c + 64 s0 + 16 t1 + 4 kt + 2 w1 + w0``: the bytes one thread needs
    for four k16 mma tiles become one 16-byte vector, and threads 4-7 sit beside 0-3 (a full line).
    Then each word's bits are twiddled. The compiled loop (:mod:`mxrepack.native`) does both in one pass;
    :func:`hopper_values_numpy` is its twin.
    """
    E, N, Kb = w.shape
    if (N % 16, Kb % 32) != (0, 0):  # (gpt-oss's 5760 x 1440 and 2880 x 1440 need no padding, and no copy)
        w = pad_rows_cols(w, round_up(N, 16), round_up(Kb, 32))
    N, Kb = w.shape[1], w.shape[2]
    lib = native.library()
    if lib is None:
        return hopper_values_numpy(w)
    return _native_values(lib, "hopper_values_pack", w, Kb, _TWIDDLE_BYTE_LUTS, _TWIDDLE_ROTATIONS).view(
        E, N // 4, Kb * 4
    )


def hopper_values_numpy(w: torch.Tensor) -> torch.Tensor:
    """:func:`hopper_value_swizzle` on an already padded ``[E, N16, Kb32]`` in torch/numpy passes."""
    E, N, Kb = w.shape
    w = w.view(E, N // 16, 2, 4, 2, Kb // 32, 4, 2, 4)  # e, r, w0, t0, s0, c, kt, w1, t1
    w = w.permute(0, 1, 3, 5, 4, 8, 6, 7, 2).reshape(E, N // 4, Kb * 4)
    return twiddle_bits(w)


def hopper_value_unswizzle(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`hopper_value_swizzle`, at the padded size ``[E, N16, Kb32]``."""
    E, N4, Kb4 = x.shape
    lib = native.library()
    if lib is None:
        return hopper_values_unpack_numpy(x)
    return _native_values(lib, "hopper_values_unpack", x, Kb4 // 4, _UNTWIDDLE_BYTE_LUTS, _UNTWIDDLE_ROTATIONS).view(
        E, N4 * 4, Kb4 // 4
    )


def hopper_values_unpack_numpy(x: torch.Tensor) -> torch.Tensor:
    E, N4, Kb4 = x.shape
    N, Kb = N4 * 4, Kb4 // 4
    w = untwiddle_bits(x).view(E, N // 16, 4, Kb // 32, 2, 4, 4, 2, 2)  # e, r, t0, c, s0, t1, kt, w1, w0
    return w.permute(0, 1, 8, 2, 4, 3, 6, 7, 5).reshape(E, N, Kb)


def blackwell_value_pad(w: torch.Tensor) -> torch.Tensor:
    return pad_rows_cols(w, w.shape[1], round_up(w.shape[2], 128))


# --- scale layouts on checkpoint-order bytes [E, N, K/32] ---------------------------------------
def hopper_scale_swizzle(s: torch.Tensor, num_warps: int = 8) -> torch.Tensor:
    """``[E, N, Ks]`` -> ``[E, Np/32, 32 * Ks2]`` (N padded to ``32 * num_warps``, Ks to 2).

    With ``n = 32 W r + 16 W a + 16 w + 8 b + c`` (a, b < 2; w < W warps; c < 8) and ``k = 2 kk + d``,
    scale (n, k) goes to row ``W r + w``, column ``64 kk + 32 a + 4 c + 2 d + b``.
    """
    E, N, Ks = s.shape
    W = num_warps
    s = pad_rows_cols(s, round_up(N, 32 * W), round_up(Ks, 2))
    N, Ks = s.shape[1], s.shape[2]
    # As bytes the permutation's innermost runs are single bytes, which torch copies at ~0.1 GB/s. Zip the
    # b = 0 and b = 1 rows first (two contiguous halves -> int16 (b0, b1)); then each (d, b) quad is one
    # int32 and the rest moves words (~6x faster in all).
    x = s.view(E, N // (32 * W), 2, W, 2, 8 * Ks)  # e, r, a, w, b, (c, k)
    z = x[:, :, :, :, 0].to(torch.int16) | (x[:, :, :, :, 1].to(torch.int16) << 8)  # e, r, a, w, (c, k); int16 (b)
    z = z.view(torch.int32).view(E, N // (32 * W), 2, W, 8, Ks // 2)  # e, r, a, w, c, kk; int32 (d, b)
    return z.permute(0, 1, 3, 5, 2, 4).contiguous().view(torch.uint8).reshape(E, N // 32, Ks * 32)


def hopper_scale_unswizzle(x: torch.Tensor, num_warps: int = 8) -> torch.Tensor:
    E, N32, Ks32 = x.shape
    W, N, Ks = num_warps, N32 * 32, Ks32 // 32
    s = x.view(E, N // (32 * W), W, Ks // 2, 2, 8, 2, 2)  # e, r, w, kk, a, c, d, b
    return s.permute(0, 1, 4, 2, 7, 5, 3, 6).reshape(E, N, Ks)


def blackwell_scale_swizzle(s: torch.Tensor) -> torch.Tensor:
    E, N, Ks = s.shape
    s = swizzle_128x4(pad_rows_cols(s, round_up(N, 128), round_up(Ks, 8)))
    return s.view(E, s.shape[1] // 128, s.shape[2] // 4, 2, 256)


def blackwell_scale_unswizzle(x: torch.Tensor) -> torch.Tensor:
    E, N128, K4 = x.shape[:3]
    return unswizzle_128x4(x.reshape(E, N128 * 128, K4 * 4))


class TritonHopperLayout(ExpertLayout):
    name = "triton-hopper"
    description = (
        "OpenAI triton_kernels matmul_ogs (as vLLM 0.33.0 calls it on Hopper): HopperMXValueLayout "
        "bit-twiddled values, HopperMXScaleLayout scales, fp32 biases, gate/up interleaved"
    )

    def __init__(
        self, value: str = "hopper", scale: str = "hopper", num_warps: int = 8, scale_groups_multiple: int = 1
    ):
        value, scale = OPTION_ALIASES.get(value, value), OPTION_ALIASES.get(scale, scale)
        for what, v in (("value", value), ("scale", scale)):
            if v not in LAYOUT_NAMES:
                raise MxRepackError(f"triton-hopper option {what}={v!r}: expected one of {', '.join(LAYOUT_NAMES)}")
        if num_warps not in (1, 2, 4, 8, 16):
            raise MxRepackError(f"triton-hopper option num_warps={num_warps!r}: expected a power of two <= 16")
        if scale_groups_multiple not in (1, 2, 4):
            raise MxRepackError(
                f"triton-hopper option scale_groups_multiple={scale_groups_multiple!r}: expected 1, 2 or 4"
            )
        self.value, self.scale, self.num_warps = value, scale, num_warps
        # vLLM's _swizzle_mxfp4 zero-pads the K/32 scale groups to a multiple of 4 on sm90 before swizzling (vLLM
        # #47303; 0.26 and 0.33): 4 gives its bytes, 1 triton_kernels' own (the golden vectors).
        self.scale_groups_multiple = scale_groups_multiple

    def _value(self, w: torch.Tensor) -> torch.Tensor:
        return {"hopper": hopper_value_swizzle, "blackwell": blackwell_value_pad, "plain": lambda t: t}[self.value](w)

    def _value_shape(self, E: int, N: int, Kb: int) -> tuple[int, ...]:
        if self.value == "hopper":
            return (E, round_up(N, 16) // 4, round_up(Kb, 32) * 4)
        return (E, N, round_up(Kb, 128) if self.value == "blackwell" else Kb)

    def _unvalue(self, x: torch.Tensor) -> torch.Tensor:
        return hopper_value_unswizzle(x) if self.value == "hopper" else x

    def _scale(self, s: torch.Tensor) -> torch.Tensor:
        if s.shape[2] % self.scale_groups_multiple:
            s = pad_rows_cols(s, s.shape[1], round_up(s.shape[2], self.scale_groups_multiple))
        if self.scale == "hopper":
            return hopper_scale_swizzle(s, self.num_warps)
        return blackwell_scale_swizzle(s) if self.scale == "blackwell" else s

    def _scale_shape(self, E: int, N: int, Ks: int) -> tuple[int, ...]:
        Ks = round_up(Ks, self.scale_groups_multiple)
        if self.scale == "hopper":
            return (E, round_up(N, 32 * self.num_warps) // 32, round_up(Ks, 2) * 32)
        if self.scale == "blackwell":
            return (E, round_up(N, 128) // 128, round_up(Ks, 8) // 4, 2, 256)
        return (E, N, Ks)

    def _unscale(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale == "hopper":
            return hopper_scale_unswizzle(x, self.num_warps)
        return blackwell_scale_unswizzle(x) if self.scale == "blackwell" else x

    def outputs(self, d: ExpertDims) -> list[OutputSpec]:
        H, I, E = d.hidden, d.intermediate, d.experts
        vname, sname = LAYOUT_NAMES[self.value][0], LAYOUT_NAMES[self.scale][1].format(w=self.num_warps)
        u = f"{UPSTREAM}: value {vname}, scale {sname}"
        specs = []
        for w, proj, N, K in (("w13", "gate_up_proj", 2 * I, H), ("w2", "down_proj", H, I)):
            vshape, sshape = self._value_shape(E, N, K // 2), self._scale_shape(E, N, K // 32)
            pad = {}
            if vshape != (E, N, K // 2):
                pad["value_storage"] = [[E, N, K // 2], list(vshape)]
            if sshape != (E, N, K // 32):
                pad["scale_storage"] = [[E, N, K // 32], list(sshape)]
            specs += [
                OutputSpec(
                    f"{w}_weight",
                    torch.uint8,
                    vshape,
                    (f"{proj}_blocks",),
                    _by_part(f"{proj}_blocks", lambda b: self._value(b.flatten(2))),
                    (E, N, K // 2),
                    pad,
                    u,
                ),
                OutputSpec(
                    f"{w}_weight_scale",
                    torch.uint8,
                    sshape,
                    (f"{proj}_scales",),
                    _by_part(f"{proj}_scales", self._scale),
                    (E, N, K // 32),
                    pad,
                    u,
                ),
                OutputSpec(
                    f"{w}_bias",
                    torch.float32,
                    (E, N),
                    (f"{proj}_bias",),
                    _by_part(f"{proj}_bias", lambda b: b.to(torch.float32)),
                    upstream=u,
                ),
            ]
        return specs

    def unpack_padded(self, stored: dict[str, torch.Tensor], d: ExpertDims) -> dict[str, torch.Tensor]:
        out = {}
        for w, proj in (("w13", "gate_up_proj"), ("w2", "down_proj")):
            v = self._unvalue(stored[f"{w}_weight"])
            s = self._unscale(stored[f"{w}_weight_scale"])
            # values and scales may be padded differently: keep the common (still padded) extent
            E, N, Kb = v.shape[0], min(v.shape[1], s.shape[1]), min(v.shape[2], s.shape[2] * 16)
            out[f"{proj}_blocks"] = v[:, :N, :Kb].reshape(E, N, Kb // 16, 16)
            out[f"{proj}_scales"] = s[:, :N, : Kb // 16]
            out[f"{proj}_bias"] = stored[f"{w}_bias"].to(torch.bfloat16)
        return out


def _by_part(part: str, fn):
    def pack(**parts: torch.Tensor) -> torch.Tensor:
        return fn(parts[part])

    return pack


LAYOUT = TritonHopperLayout()
