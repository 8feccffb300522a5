"""``marlin``: vLLM's Marlin MXFP4 MoE weights (W4A16, BF16 activations), as vLLM 0.33.0 prepares them.

Matches ``marlin_utils_fp4.py::prepare_moe_mxfp4_layer_for_marlin`` byte for byte (golden
``vllm_marlin.safetensors``). Steps per expert and projection (layouts.md 1.2-1.6):

* zero-pad: hidden to a multiple of 256, intermediate to a multiple of 128 (gpt-oss 2880/2880 ->
  3072/2944), padding rows/columns appended after the real ones (what vLLM's loader does);
* weight: ``gptq_marlin_repack`` (4-bit) -> int32 ``[E, K/16, 2N]``. In each 16x64 tile, lane
  ``l`` and warp ``w`` own column ``n = 16w + l//4`` (and ``n+8``) and rows ``k = 2(l%4)`` (+1, +8,
  +9); the eight nibbles of a word are, low to high, (k,n) (k+8,n) (k,n+8) (k+8,n+8) (k+1,n)
  (k+9,n) (k+1,n+8) (k+9,n+8) -- the B fragment of ``mma.sync m16n8k16``;
* scales: ``[K/32, N]``, ``marlin_permute_scales`` (8x8 transposes of 64-column groups), then the
  E8M0 ``[0,2,1,3]`` swap of each 4 consecutive bytes, stored as ``float8_e8m0fnu``. No W4A8 variant: vLLM's
  FP8-activation Marlin (``VLLM_MARLIN_INPUT_DTYPE``) repacks weights and scales with ``is_a_8bit`` (other tiles and
  permutations, and +6 on every exponent), which no golden vector here pins down;
* bias: ``marlin_permute_bias`` on each expert's ``[N]``, BF16.

Gate/up rows keep the checkpoint interleave (even = gate, odd = up).
"""

from __future__ import annotations

import numpy as np
import torch

from mxrepack import native
from mxrepack.errors import MxRepackError
from mxrepack.layouts import bitops
from mxrepack.layouts.base import ExpertDims, ExpertLayout, OutputSpec, pad_rows_cols, round_up
from mxrepack.quant.mx import map_row_blocks

UPSTREAM = (
    "vllm 0.33.0 marlin_utils_fp4.prepare_moe_mxfp4_layer_for_marlin "
    "(gptq_marlin_repack, marlin_permute_scales, mxfp4_marlin_process_scales, marlin_permute_bias)"
)
_SCALE_PERM = torch.tensor([i + 8 * j for i in range(8) for j in range(8)])
_BIAS_PERM = torch.tensor([2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)])
_E8M0_SWAP = torch.tensor([0, 2, 1, 3])  # self-inverse


# Marlin's 64-column tile, as the 32-bit words of a block of 64 rows after the three delta swaps of
# repack_weight, indexed [warp 4, c 2, l8 8, kt K/16, h 2], goes out as [kt, l8, (h, c) = l4, warp].
def _tile_word_order(k16: int) -> np.ndarray:
    i = np.arange(64 * k16 * 2).reshape(4, 2, 8, k16, 2)
    return np.ascontiguousarray(i.transpose(3, 2, 4, 1, 0)).reshape(-1)


def repack_weight(packed: torch.Tensor, rows: int | None = None, kbytes: int | None = None) -> torch.Tensor:
    """``[E, N, K/2]`` uint8 (checkpoint nibble order) -> Marlin int32 ``[E, K/16, 2N]``, zero-padding N to
    ``rows`` and the packed K bytes to ``kbytes`` on the way.

    Word ``(kt, n tile, l8, l4, warp)`` holds, from column ``n = 16 warp + l8`` (c = 0) and ``n + 8``
    (c = 1), packed bytes ``kb = 8 kt + l4`` (a = 0) and ``kb + 4`` (a = 1): its byte ``2h + c`` is the low
    (h = 0) or high (h = 1) nibbles of the a = 0 and a = 1 bytes, a = 1 on top. Per block of 64-row
    tiles (:mod:`~mxrepack.layouts.bitops`), on the 64-bit words of each row (4 bytes of a = 0, then
    4 of a = 1) three delta swaps exchange nibble-in-byte with a, then bit 1 of l4 with the word half
    (so a word holds bytes l4 in {0,1} or {2,3} of h = 0 and 1), then byte-in-word bit 0 with c (rows
    n and n + 8); each 32-bit word then is a finished output word, and one gather puts them in order.
    Where the compiled loop is built (:mod:`mxrepack.native`), it writes each word straight from its four
    bytes instead; :func:`repack_weight_numpy` is its twin.
    """
    E, N, Kb = packed.shape
    rows, kbytes = rows or N, kbytes or Kb
    if rows % 64 or kbytes % 8 or rows < N or kbytes < Kb or Kb % 8:
        raise MxRepackError(
            f"Marlin repack needs N % 64 == 0 and K % 16 == 0 (padded and source), got N={rows}, "
            f"K={2 * kbytes}, source K={2 * Kb}"
        )
    lib = native.library()
    if lib is None:
        return repack_weight_numpy(packed, rows, kbytes)
    src = packed.contiguous().numpy()
    out = native.empty((E, kbytes // 8, rows // 64, 128), np.uint32)
    zero_row = np.zeros(Kb, np.uint8)

    pack = lib.marlin_weights_pack_simd if native.simd() else lib.marlin_weights_pack

    def work(u0: int, u1: int) -> None:
        pack(native.ptr(src), native.ptr(out), u0, u1, N, Kb, rows, kbytes, native.ptr(zero_row))

    map_row_blocks(E * (rows // 64), work, min_rows=8)
    return torch.from_numpy(out.view(np.int32)).view(E, kbytes // 8, 2 * rows)


def repack_weight_numpy(packed: torch.Tensor, rows: int, kbytes: int) -> torch.Tensor:
    """:func:`repack_weight` by delta swaps in numpy (no compiler needed)."""
    E, N, Kb = packed.shape
    k16, tiles = kbytes // 8, rows // 64
    per = max(1, bitops.BLOCK_BYTES // (64 * kbytes))  # tiles per block
    blocks = -(-tiles // per)
    order = _tile_word_order(k16)
    src = packed.contiguous().numpy()
    out = np.empty((E, k16, tiles, 128), np.int32)

    def scratch():  # zeroed once: padding columns stay zero (every step maps zero bytes to zero bytes)
        return (
            np.zeros((per * 64, kbytes), np.uint8),
            np.empty((per * 64, k16), np.uint64),
            np.empty((per, k16 * 128), np.int32),
        )

    def work(i: int, s) -> None:
        block, tmp, words = s
        e, t0 = i // blocks, i % blocks * per
        nt = min(per, tiles - t0)
        n, r0 = nt * 64, t0 * 64
        valid = max(0, min(N - r0, n))
        block[:valid, :Kb] = src[e, r0 : r0 + valid]
        block[valid:n] = 0
        x, t = block[:n].view(np.uint64), tmp[:n]
        bitops.delta_swap(x, t, 28, 0x00000000F0F0F0F0)  # nibble-in-byte <-> a
        bitops.delta_swap(x, t, 16, 0x00000000FFFF0000)  # l4 bit 1 <-> word half (h)
        pairs = x.reshape(nt * 4, 2, 8 * k16)  # [warp, c, (l8, kt)]
        bitops.delta_swap_pair(pairs[:, 0], pairs[:, 1], t[: n // 2].reshape(nt * 4, 8 * k16), 8, 0x00FF00FF00FF00FF)
        np.take(block[:n].view(np.int32).reshape(nt, -1), order, axis=1, out=words[:nt], mode="clip")
        out[e, :, t0 : t0 + nt] = words[:nt].reshape(nt, k16, 128).transpose(1, 0, 2)

    bitops.for_each_block(E * blocks, work, scratch)
    return torch.from_numpy(out).view(E, k16, 2 * rows)


def unrepack_weight(words: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`repack_weight`."""
    E, K16, N2 = words.shape
    N, K = N2 // 2, K16 * 16
    o0, o1, o2, o3 = words.contiguous().view(torch.uint8).view(E, K16, N2, 4).unbind(-1)
    b = torch.stack(
        [(o0 & 15) | (o2 << 4), (o0 >> 4) | (o2 & 0xF0), (o1 & 15) | (o3 << 4), (o1 >> 4) | (o3 & 0xF0)], -1
    )
    b = b.view(E, K // 16, N // 64, 8, 4, 4, 2, 2)  # e, kt, nt, l8, l4, warp, c, a
    return b.permute(0, 2, 5, 6, 3, 1, 7, 4).reshape(E, N, K // 2)


# Within each 64 consecutive N of a scale row: ``marlin_permute_scales`` (an 8x8 transpose), then the E8M0
# ``[0,2,1,3]`` swap of every 4 bytes, as one gather index
_SCALE_GROUP_ORDER = _SCALE_PERM.view(-1, 4)[:, _E8M0_SWAP].reshape(-1)


def permute_scales(scales: torch.Tensor) -> torch.Tensor:
    """``[E, N, K/32]`` E8M0 bytes -> Marlin ``[E, K/32, N]`` bytes (a pure permutation): the rows (N) reordered
    inside every 64 by one row gather, then one transposing copy (1.5x faster than transposing first and gathering
    single bytes)."""
    N = scales.shape[1]
    rows = torch.arange(N).view(-1, 64)[:, _SCALE_GROUP_ORDER].reshape(-1)  # N is padded to Marlin's 64-column tiles
    return scales.index_select(1, rows).transpose(1, 2).contiguous()


def unpermute_scales(s: torch.Tensor) -> torch.Tensor:
    E, shape = s.shape[0], s.shape
    s = s.reshape(E, -1, 4)[:, :, _E8M0_SWAP].reshape(shape)
    inv = torch.argsort(_SCALE_PERM)
    return s.reshape(E, -1, 64)[:, :, inv].reshape(shape).transpose(1, 2).contiguous()


def permute_bias(bias: torch.Tensor) -> torch.Tensor:
    return bias.reshape(bias.shape[0], -1, 32)[:, :, _BIAS_PERM].reshape(bias.shape)


def unpermute_bias(bias: torch.Tensor) -> torch.Tensor:
    return bias.reshape(bias.shape[0], -1, 32)[:, :, torch.argsort(_BIAS_PERM)].reshape(bias.shape)


class MarlinLayout(ExpertLayout):
    name = "marlin"
    description = (
        "vLLM Marlin MXFP4 MoE: hidden padded to 256, intermediate to 128; int32 [E,K/16,2N] repacked "
        "weights, permuted E8M0 scales [E,K/32,N], permuted bf16 biases"
    )

    def padded(self, d: ExpertDims) -> tuple[int, int]:
        return round_up(d.hidden, 256), round_up(d.intermediate, 128)

    def outputs(self, d: ExpertDims) -> list[OutputSpec]:
        H, I, E = d.hidden, d.intermediate, d.experts
        Hp, Ip = self.padded(d)
        pad = {"hidden": [H, Hp], "intermediate": [I, Ip]}

        def w13(gate_up_proj_blocks):
            return repack_weight(gate_up_proj_blocks.flatten(2), 2 * Ip, Hp // 2)

        def w13_scale(gate_up_proj_scales):
            return permute_scales(pad_rows_cols(gate_up_proj_scales, 2 * Ip, Hp // 32)).view(torch.float8_e8m0fnu)

        def w13_bias(gate_up_proj_bias):
            return permute_bias(
                pad_rows_cols(gate_up_proj_bias.unsqueeze(-1), 2 * Ip, 1).squeeze(-1).to(torch.bfloat16)
            )

        def w2(down_proj_blocks):
            return repack_weight(down_proj_blocks.flatten(2), Hp, Ip // 2)

        def w2_scale(down_proj_scales):
            return permute_scales(pad_rows_cols(down_proj_scales, Hp, Ip // 32)).view(torch.float8_e8m0fnu)

        def w2_bias(down_proj_bias):
            return permute_bias(pad_rows_cols(down_proj_bias.unsqueeze(-1), Hp, 1).squeeze(-1).to(torch.bfloat16))

        return [
            OutputSpec(
                "w13_weight",
                torch.int32,
                (E, Hp // 16, 4 * Ip),
                ("gate_up_proj_blocks",),
                w13,
                (E, H // 16, 4 * I),
                pad,
                UPSTREAM,
                6,
            ),
            OutputSpec(
                "w13_weight_scale",
                torch.float8_e8m0fnu,
                (E, Hp // 32, 2 * Ip),
                ("gate_up_proj_scales",),
                w13_scale,
                (E, H // 32, 2 * I),
                pad,
                UPSTREAM,
            ),
            OutputSpec(
                "w13_bias", torch.bfloat16, (E, 2 * Ip), ("gate_up_proj_bias",), w13_bias, (E, 2 * I), pad, UPSTREAM
            ),
            OutputSpec(
                "w2_weight",
                torch.int32,
                (E, Ip // 16, 2 * Hp),
                ("down_proj_blocks",),
                w2,
                (E, I // 16, 2 * H),
                pad,
                UPSTREAM,
                6,
            ),
            OutputSpec(
                "w2_weight_scale",
                torch.float8_e8m0fnu,
                (E, Ip // 32, Hp),
                ("down_proj_scales",),
                w2_scale,
                (E, I // 32, H),
                pad,
                UPSTREAM,
            ),
            OutputSpec("w2_bias", torch.bfloat16, (E, Hp), ("down_proj_bias",), w2_bias, (E, H), pad, UPSTREAM),
        ]

    def unpack_padded(self, stored: dict[str, torch.Tensor], d: ExpertDims) -> dict[str, torch.Tensor]:
        w13, w2 = unrepack_weight(stored["w13_weight"]), unrepack_weight(stored["w2_weight"])
        E = w13.shape[0]
        return {
            "gate_up_proj_blocks": w13.reshape(E, w13.shape[1], -1, 16),
            "gate_up_proj_scales": unpermute_scales(stored["w13_weight_scale"].view(torch.uint8)),
            "gate_up_proj_bias": unpermute_bias(stored["w13_bias"]),
            "down_proj_blocks": w2.reshape(E, w2.shape[1], -1, 16),
            "down_proj_scales": unpermute_scales(stored["w2_weight_scale"].view(torch.uint8)),
            "down_proj_bias": unpermute_bias(stored["w2_bias"]),
        }


LAYOUT = MarlinLayout()
