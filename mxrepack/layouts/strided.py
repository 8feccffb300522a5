"""``strided``: the layout mxrepack's own Triton kernels consume (``mxrepack.kernels``), in one of three byte orders.

Plain packed bytes, nothing a TMA descriptor or a swizzled shared-memory atom would need:

* hidden and intermediate zero-padded to ``tile`` (default 128, 2880 -> 2944), so kernels need no K
  masks and every row is whole 128-code K tiles;
* w13 packed FP4 (low nibble = even k), its rows in tiles of :data:`GATE_UP_TILE` intermediate rows:
  tile i holds gate rows ``32i .. 32i+31`` then the same up rows (64 weight rows), so that one decode
  program's gate and up rows are one tile and the SwiGLU is applied in registers; w2's rows in tiles of
  :data:`DOWN_TILE_ROWS`;
* each row tile K-tiled: ``[rows / R, Kp / 128, R, 64]`` bytes per expert (R = 64 for w13, 16 for w2),
  stored as ``[E, rows, Kp/2]``. One K step of a decode program (R rows x 128-1024 codes) is then one
  contiguous block, and a program's whole slice one contiguous range: on H100 this took the MoE decode
  from 53% / 66% / 37% of the copy roofline to 59% / 83% / 46% at T = 1 / 8 / 64 over row-major rows
  1472 bytes apart (docs/PERF_LOG.md, stop 12);
* scales ``[E, rows, K/32]`` raw E8M0 bytes, rows in the same order as the weights';
* biases float32 (the kernels add them to the fp32 accumulator), rows ``[gate(0:Ip) | up(Ip:2Ip)]`` and
  w2's rows in order (a kernel indexes them by output row).

Option ``order`` (:data:`ORDERS`), the order of the bytes inside those blocks:

* ``"rows"`` (the default, and every output written before the option): each K tile's R rows in order, 64
  bytes each; scales row-major. Read by the kernels on every GPU they build for (sm80 and newer, sm_12x
  included);
* ``"wgmma"``: each contiguous 1024-byte chunk of the above (16 rows x 64 bytes of one K tile) in the order of
  Hopper wgmma's register A fragments (:func:`wgmma_order`: lane ``4g + t``'s 32 bytes together, one 32-bit word
  per k16 step), each word's 32 bits then placed for a rotate-and-mask decode (:data:`WORD_ROTATIONS`; since
  mxrepack 0.2.0, whose kernels do not read the byte-wise words written before), and the scales tiled the same way,
  each chunk's 64 scales together in the quad order (:func:`quad_scales`). For the sm_90 kernels only: on sm_12x
  the ``mma.sync`` fragment is another order, and these bytes decode wrong there;
* ``"mma2"``: the same chunks in the order of the ``mma.sync`` (mma v2) A operand Triton builds from them on sm_12x
  (and sm_80-89): lane ``4g + t``'s 32 bytes together, its word ``2q + c`` the 4 bytes ``16q + 4t ..`` of chunk row
  ``8c + g`` -- 8 consecutive codes of one row, the operand's kWidth 8 (:func:`mma2_order`;
  ``benchmarks/experiments/mma2_order_probe.py`` found and timed it) -- each word's bits placed as in the wgmma order
  (the pairs are again byte p's two codes, so the same decode serves), and the scales in the same quad order. For
  the ``mma.sync`` kernels (sm_12x, sm_80-89); on sm_90 Triton builds wgmma, whose fragment this is not.

The shapes are the same in every order; only the byte order inside each chunk differs.
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
    gate_up_from_halves,
    gate_up_halves_padded,
    packed_expert_outputs,
    pad_rows_cols,
    round_up,
)
from mxrepack.layouts.bitops import BLOCK_BYTES, delta_swap, delta_swap_pair, for_each_block

UPSTREAM = "mxrepack.kernels (moe_mxfp4 / linear_mxfp4 Triton kernels)"
GATE_UP_TILE = 32  # intermediate rows per w13 row tile: 32 gate rows, then the same 32 up rows
DOWN_TILE_ROWS = 16  # w2 rows per row tile
K_TILE_BYTES = 64  # packed bytes of one K tile (128 codes, four scale groups)
ORDERS = ("rows", "wgmma", "mma2")  # the byte orders of option ``order`` (mxrepack.serve.spec.STRIDED_ORDERS repeats)
CHUNK_BYTES = 1024  # 16 rows x one K tile: the unit inside which the wgmma and mma2 orders permute the bytes
# rows per row tile of each scale tensor (the weights': the chunk orders tile the scales as the weights)
SCALE_ROWS_PER_TILE = {"w13_weight_scale": 2 * GATE_UP_TILE, "w2_weight_scale": DOWN_TILE_ROWS}


def k_tiled(rows: torch.Tensor, tiles: int, k_bytes: int) -> torch.Tensor:
    """Row tiles ``[E, t, A, B, Kb]`` (tile rows in order (b, a): w13's (half, row), w2's (1, row)) ->
    ``[E, tiles * B * A, k_bytes]`` K-tiled bytes ``[E, tiles, k_bytes / 64, B, A, 64]``: tiles past ``t``,
    and bytes past ``Kb`` in each row, zero. Each output byte is written once."""
    E, t, A, B, kb = rows.shape
    T, full = k_bytes // K_TILE_BYTES, kb // K_TILE_BYTES
    rest = kb - full * K_TILE_BYTES
    out = rows.new_empty((E, tiles, T, B, A, K_TILE_BYTES))
    real = out[:, :t]
    real[:, :, :full] = rows[..., : full * K_TILE_BYTES].unflatten(-1, (full, K_TILE_BYTES)).permute(0, 1, 4, 3, 2, 5)
    if rest:
        real[:, :, full, :, :, :rest] = rows[..., full * K_TILE_BYTES :].transpose(2, 3)
        real[:, :, full, :, :, rest:].zero_()
    real[:, :, full + (rest > 0) :].zero_()
    out[:, t:].zero_()
    return out.view(E, tiles * B * A, k_bytes)


def k_untiled(stored: torch.Tensor, rows_per_tile: tuple[int, int]) -> torch.Tensor:
    """Inverse of :func:`k_tiled` at the padded size: ``[E, N, Kp/2]`` -> row tiles ``[E, N / (A*B), A, B, Kp/2]``."""
    A, B = rows_per_tile
    E, N, k_bytes = stored.shape
    tiled = stored.view(E, N // (A * B), k_bytes // K_TILE_BYTES, B, A, K_TILE_BYTES)
    return tiled.permute(0, 1, 4, 3, 2, 5).reshape(E, N // (A * B), A, B, k_bytes)


def gate_up_tiles(x: torch.Tensor, Ip: int, cols: int) -> torch.Tensor:
    """Interleaved gate/up rows ``[E, 2I, c]`` -> row-major ``[E, 2*Ip, cols]`` in w13's tile order (padding zero)."""
    E, I2, c = x.shape
    out = x.new_empty((E, Ip // GATE_UP_TILE, 2, GATE_UP_TILE, cols))
    t = I2 // 2 // GATE_UP_TILE
    out[:, :t, :, :, :c] = x.reshape(E, t, GATE_UP_TILE, 2, c).transpose(2, 3)
    out[:, :t, :, :, c:].zero_()
    out[:, t:].zero_()
    return out.view(E, 2 * Ip, cols)


def gate_up_untiled(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`gate_up_tiles` at the padded size: w13 tile order -> interleaved rows."""
    E, N, c = x.shape
    return x.view(E, N // (2 * GATE_UP_TILE), 2, GATE_UP_TILE, c).transpose(2, 3).reshape(E, N, c)


# The bits of each 32-bit word of the wgmma order. Before them, a word is four bytes of one lane's A fragment, byte p
# the bf16 pair p (its low nibble the pair's low half). Their 32 bits are then placed so that the kernels decode pair
# p in two or three instructions (``dequant_mxfp4.WORD_ASM``): rotating the word left by WORD_ROTATIONS[p][j] puts
# code bit j (mantissa, exponent low, exponent high, sign) of each half at WORD_DECODED_BITS[j] of that half -- the
# bf16 value times 2^-126, as Marlin and triton_kernels decode E2M1 -- and a mask keeps them. Three pairs rotate
# whole (by 6, 2 and 12); four cannot (no four rotations of one pair's 8 bits tile a word: every choice was
# searched), so pair 3 keeps its exponent and sign bits in place and rotates its mantissa bits by 8. Against the
# byte-wise decode this saves 8 of 21 instructions per word (prmt, and, shr, lop3 and the multiply per byte).
WORD_DECODED_BITS = (6, 7, 8, 15)
WORD_ROTATIONS = ((6, 6, 6, 6), (2, 2, 2, 2), (12, 12, 12, 12), (8, 0, 0, 0))


def word_bit(pair: int, half: int, bit: int) -> int:
    """The bit of a stored wgmma-order word that holds ``bit`` (0 mantissa .. 3 sign) of the code in ``half`` (0 low
    nibble, 1 high) of fragment byte ``pair``."""
    return (16 * half + WORD_DECODED_BITS[bit] - WORD_ROTATIONS[pair][bit]) % 32


def _word_bit_tables(part_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Per ``part_bits``-bit part of a word, the permuted bits of each of its values (forward: fragment word ->
    stored; inverse: stored -> fragment), ``[32 / part_bits, 2^part_bits]`` uint32 each: a bit permutation is the OR
    of its parts' images. 16-bit parts for numpy (two gathers a word), bytes for the native loop (1 KB a table)."""
    src = np.array([8 * p + 4 * h + j for p in range(4) for h in range(2) for j in range(4)])
    dst = np.array([word_bit(p, h, j) for p in range(4) for h in range(2) for j in range(4)])
    v = np.arange(1 << part_bits, dtype=np.uint32)
    tables = []
    for a, b in ((src, dst), (dst, src)):
        t = np.zeros((32 // part_bits, 1 << part_bits), np.uint32)
        for i, o in zip(a, b, strict=True):
            t[i // part_bits] |= ((v >> np.uint32(i % part_bits)) & np.uint32(1)) << np.uint32(o)
        tables.append(t)
    return tables[0], tables[1]


_WORD_BITS_16 = _word_bit_tables(16)  # (forward, inverse)
_WORD_BITS_8 = _word_bit_tables(8)


def _permute_word_bits(words: np.ndarray, inverse: bool) -> None:
    """In place on contiguous uint32 words: each one's bits placed (fragment -> stored) or, ``inverse``, put back:
    the compiled loop (:mod:`mxrepack.native`, byte tables) where it is built, else two numpy gathers a word (the
    same words; the tests compare them)."""
    lib = native.library()
    if lib is not None:
        lib.permute_word_bits(native.ptr(words), words.size, native.ptr(_WORD_BITS_8[inverse]))
        return
    table = _WORD_BITS_16[inverse]
    hi = np.take(table[1], words >> np.uint32(16))
    np.bitwise_and(words, np.uint32(0xFFFF), out=words)
    np.take(table[0], words, out=words)
    words |= hi


def _permute_word_bits_torch(words: torch.Tensor, inverse: bool) -> torch.Tensor:
    """:func:`_permute_word_bits` on int32 words of any device (a GPU's gathers)."""
    table = torch.from_numpy(_WORD_BITS_16[inverse].view(np.int32)).to(words.device)
    lo, hi = table[0][(words & 0xFFFF).long()], table[1][((words >> 16) & 0xFFFF).long()]  # one int64 index at a time
    return lo.bitwise_or_(hi)


def check_order(order) -> str:
    """``order`` if it is one of :data:`ORDERS`, else a one-line :class:`MxRepackError`."""
    if order not in ORDERS:
        raise MxRepackError(f"strided option order={order!r}: expected one of {', '.join(ORDERS)}")
    return order


def wgmma_order(k_tiled: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """K-tiled bytes (:func:`k_tiled`'s, any shape, whole 1024-byte chunks in memory order) -> the same bytes in
    wgmma's A-fragment order: in each chunk (16 rows x 64 bytes of one K tile), byte ``8s + 4kh + t`` of row
    ``8c + g`` goes to ``32 (4g + t) + 4s + 2c + kh`` -- lane ``4g + t``'s 32 bytes, its word ``s`` holding bytes
    (g, 8s+t), (g, 8s+t+4), (g+8, 8s+t), (g+8, 8s+t+4) (``benchmarks/experiments/fragment_order_probe.py``'s
    ``fragment_order``, per chunk); then each word's bits placed (bit ``j`` of nibble ``h`` of its byte ``p`` at
    :func:`word_bit`). ``out`` (same shape, may be ``k_tiled`` itself) receives them where given."""
    return _wgmma_chunks(k_tiled, out, inverse=False)


def k_tiled_from_wgmma(stored: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse of :func:`wgmma_order`: wgmma-ordered bytes -> K-tiled bytes."""
    return _wgmma_chunks(stored, out, inverse=True)


def _wgmma_chunks(x: torch.Tensor, out: torch.Tensor | None, inverse: bool) -> torch.Tensor:
    if x.dtype != torch.uint8 or x.numel() % CHUNK_BYTES:
        raise ValueError(f"wgmma order: {x.dtype} {list(x.shape)} is not whole {CHUNK_BYTES}-byte chunks of bytes")
    if x.device.type != "cpu":  # a GPU moves single bytes at memory speed
        y = _wgmma_chunks_torch(x, inverse)
        return y if out is None else out.copy_(y)
    if out is not None and not out.is_contiguous():
        raise ValueError("wgmma order: out must be contiguous")
    return _wgmma_chunks_cpu(x, out, inverse)


def _wgmma_chunks_torch(x: torch.Tensor, inverse: bool) -> torch.Tensor:
    """:func:`_wgmma_chunks` as one torch permutation of single bytes and a table gather per 16 bits for the word bits
    (GPUs; the CPU path's twin)."""
    if inverse:  # the word bits, then (g, t, s, c, kh) -> (c, g, s, kh, t)
        y = _permute_word_bits_torch(_aligned(x).view(-1).view(torch.int32), inverse=True).view(torch.uint8)
        return y.reshape(-1, 8, 4, 8, 2, 2).permute(0, 4, 1, 3, 5, 2).reshape(x.shape)
    y = x.reshape(-1, 2, 8, 8, 2, 4).permute(0, 2, 5, 3, 1, 4).reshape(-1)  # (c, g, s, kh, t) -> (g, t, ...)
    return _permute_word_bits_torch(y.view(torch.int32), inverse=False).view(torch.uint8).view(x.shape)


def _wgmma_chunks_cpu(x: torch.Tensor, out: torch.Tensor | None, inverse: bool) -> torch.Tensor:
    """:func:`_wgmma_chunks` on the CPU without single-byte copies (torch's permutation of bytes ran at 0.24 GB/s on
    the 2-core dev VM; the byte order alone here 1.3-2.7 GB/s, a plain copy's speed, and with the word bits 1.1-1.2
    GB/s forward, 0.5 inverse): in source order the chunk's 64-bit words are ``(c, g, s)``, each 8 bytes ``(kh, t)``,
    and the order is two exchanges of address bits of a byte -- kh with t's low bit inside each word, c with t's high
    bit between the chunk's halves (delta swaps, :mod:`mxrepack.layouts.bitops`) -- and a gather of whole 32-bit
    words, ``(c, g, s, kh) -> (g, c, kh, s)``; each word's bits are placed between the swaps and the gather
    (:func:`_permute_word_bits`; undone after the gather, inverse). Run a block of chunks at a time (the block in L2
    through every pass), blocks over the cores; ``out`` may be ``x`` (each block is read whole before it is
    written)."""
    src = x.contiguous().numpy().reshape(-1, CHUNK_BYTES)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    dst = out.numpy().reshape(-1, CHUNK_BYTES)
    n = src.shape[0]
    per_block = min(n, BLOCK_BYTES // CHUNK_BYTES)

    def work(i: int, scratch: tuple[np.ndarray, np.ndarray]) -> None:
        a, b = i * per_block, min(n, (i + 1) * per_block)
        w, t = (s[: b - a] for s in scratch)
        words = w.view(np.uint32).reshape(-1, 2, 8, 8, 2)  # (c, g, s, kh) in source order
        gathered = words.transpose(0, 2, 1, 4, 3)  # (g, c, kh, s)
        if inverse:  # whole words in source order, their bits put back
            gathered[...] = src[a:b].view(np.uint32).reshape(-1, 8, 2, 2, 8)
            _permute_word_bits(w.view(np.uint32).reshape(-1), inverse=True)
        else:
            np.copyto(w, src[a:b].view(np.uint64))
        delta_swap(w, t, 24, 0x00000000FF00FF00)  # bytes (kh, t) = (0, 1|3) <-> (1, 0|2)
        delta_swap_pair(w[:, :64], w[:, 64:], t[:, :64], 16, 0x0000FFFF0000FFFF)  # c = 1, t < 2 <-> c = 0, t >= 2
        if inverse:
            np.copyto(dst[a:b].view(np.uint64), w)
        else:  # each 32-bit word now holds its 4 bytes: their bits placed, then the gather of whole words
            _permute_word_bits(w.view(np.uint32).reshape(-1), inverse=False)
            dst[a:b].view(np.uint32).reshape(-1, 8, 2, 2, 8)[...] = gathered

    def scratch() -> tuple[np.ndarray, np.ndarray]:
        return np.empty((per_block, CHUNK_BYTES // 8), np.uint64), np.empty((per_block, CHUNK_BYTES // 8), np.uint64)

    if n:
        for_each_block(-(-n // per_block), work, scratch)
    return out.view(x.shape)


def mma2_order(k_tiled: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """K-tiled bytes (:func:`k_tiled`'s, whole 1024-byte chunks in memory order) -> the same bytes in the A-operand
    order of ``mma.sync`` as Triton builds it from a packed decode (kWidth 8): in each chunk (16 rows x 64 bytes of one
    K tile), lane ``4g + t``'s 32 bytes together, its 32-bit word ``2q + c`` the bytes ``16q + 4t .. 16q + 4t + 3`` of
    row ``8c + g`` (whole words move: a gather of 32-bit words, no byte is split from its word); then each word's bits
    placed as in the wgmma order (:data:`WORD_ROTATIONS`: byte p of the word is pair p there too)."""
    return _mma2_chunks(k_tiled, out, inverse=False)


def k_tiled_from_mma2(stored: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse of :func:`mma2_order`: mma2-ordered bytes -> K-tiled bytes."""
    return _mma2_chunks(stored, out, inverse=True)


def _mma2_chunks(x: torch.Tensor, out: torch.Tensor | None, inverse: bool) -> torch.Tensor:
    """A chunk's words in source order are ``(c, g, q, t)`` (row ``8c + g``, word ``4q + t`` of its 16); stored, they
    are ``(g, t, q, c)``. On the CPU a block of chunks at a time (the block in L2 through the gather and the word bits),
    blocks over the cores; ``out`` may be ``x``."""
    if x.dtype != torch.uint8 or x.numel() % CHUNK_BYTES:
        raise ValueError(f"mma2 order: {x.dtype} {list(x.shape)} is not whole {CHUNK_BYTES}-byte chunks of bytes")
    if x.device.type != "cpu":  # a GPU gathers words at memory speed
        y = _mma2_chunks_torch(x, inverse)
        return y if out is None else out.copy_(y)
    if out is not None and not out.is_contiguous():
        raise ValueError("mma2 order: out must be contiguous")
    src = x.contiguous().numpy().reshape(-1, CHUNK_BYTES).view(np.uint32)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    dst = out.numpy().reshape(-1, CHUNK_BYTES).view(np.uint32)
    n = src.shape[0]
    per_block = min(n, BLOCK_BYTES // CHUNK_BYTES)

    def work(i: int, scratch: np.ndarray) -> None:
        a, b = i * per_block, min(n, (i + 1) * per_block)
        w = scratch[: b - a]
        np.copyto(w, src[a:b])  # read whole before dst (which may be src) is written
        if inverse:
            _permute_word_bits(w.reshape(-1), inverse=True)
            dst[a:b].reshape(-1, 2, 8, 4, 4)[...] = w.reshape(-1, 8, 4, 4, 2).transpose(0, 4, 1, 3, 2)
        else:
            stored = dst[a:b].reshape(-1, 8, 4, 4, 2)
            stored[...] = w.reshape(-1, 2, 8, 4, 4).transpose(0, 2, 4, 3, 1)
            _permute_word_bits(dst[a:b].reshape(-1), inverse=False)

    if n:
        for_each_block(-(-n // per_block), work, lambda: np.empty((per_block, CHUNK_BYTES // 4), np.uint32))
    return out.view(x.shape)


def _mma2_chunks_torch(x: torch.Tensor, inverse: bool) -> torch.Tensor:
    """:func:`_mma2_chunks` as one torch permutation of 32-bit words and a table gather per 16 bits for the word bits
    (GPUs; the CPU path's twin)."""
    words = _aligned(x).view(-1).view(torch.int32)
    if inverse:
        words = _permute_word_bits_torch(words, inverse=True).view(-1, 8, 4, 4, 2).permute(0, 4, 1, 3, 2)
        return words.reshape(-1).view(torch.uint8).view(x.shape)
    words = words.view(-1, 2, 8, 4, 4).permute(0, 2, 4, 3, 1).reshape(-1)
    return _permute_word_bits_torch(words, inverse=False).view(torch.uint8).view(x.shape)


def quad_scales(scales: torch.Tensor, rows_per_tile: int) -> torch.Tensor:
    """Row-major E8M0 scales ``[E, N, G]`` (rows in the stored order, ``G = Kp/32``) -> the same shape in the quad
    order of the chunk orders (wgmma and mma2): tiled as the weights (row tiles of ``rows_per_tile`` rows, in each the
    K tiles, in each the 16-row blocks: ``[E, N/R, G/4, R/16, 64]``), each block's 64 scales with (row ``8c + g``,
    group ``j`` of the K tile) at ``8g + 2j + c`` -- the 8 that quad g's lanes all need, together."""
    E, N, G = scales.shape
    R = rows_per_tile
    words = _aligned(scales).view(torch.int32).view(E, N // R, R // 16, 2, 8, G // 4)  # (c, g, K tile), bytes j
    pairs = words.permute(0, 1, 5, 2, 4, 3).contiguous().view(torch.int64)  # (K tile, block, g), bytes (c, j)
    pairs = _byte_swap(pairs, 16, 0x00000000FFFF0000)  # (c, j1, j0) -> (j1, c, j0)
    pairs = _byte_swap(pairs, 8, 0x0000FF000000FF00)  # -> (j1, j0, c)
    return pairs.view(torch.uint8).view(E, N, G)


def scales_from_quad(stored: torch.Tensor, rows_per_tile: int) -> torch.Tensor:
    """Inverse of :func:`quad_scales`: ``[E, N, G]`` in the quad order -> row-major."""
    E, N, G = stored.shape
    R = rows_per_tile
    pairs = _byte_swap(_aligned(stored).reshape(-1).view(torch.int64), 8, 0x0000FF000000FF00)
    pairs = _byte_swap(pairs, 16, 0x00000000FFFF0000)
    words = pairs.view(torch.int32).view(E, N // R, G // 4, R // 16, 8, 2)  # (K tile, block, g, c), bytes j
    return words.permute(0, 1, 3, 5, 4, 2).contiguous().view(torch.uint8).view(E, N, G)


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """``x`` contiguous and starting on a 64-bit word, as viewing its bytes as words needs (copied if not: an expert
    range of a tensor whose experts are not whole words apart)."""
    x = x.contiguous()
    return x.clone() if x.storage_offset() % 8 else x


def _byte_swap(x: torch.Tensor, shift: int, mask: int) -> torch.Tensor:
    """int64 words with the bits of ``mask`` exchanged with those ``shift`` places above them (a delta swap; the
    arithmetic right shift's sign bits fall outside ``mask``)."""
    t = ((x >> shift) ^ x) & mask
    return x ^ t ^ (t << shift)


# the chunk orders' weight byte orders: (K-tiled -> order, order -> K-tiled); both take the scales in the quad order
CHUNK_ORDERS = {"wgmma": (wgmma_order, k_tiled_from_wgmma), "mma2": (mma2_order, k_tiled_from_mma2)}


def in_order(stored: dict[str, torch.Tensor], order: str, in_place: bool = False) -> dict[str, torch.Tensor]:
    """The layout's tensors in the ``"rows"`` order -> in byte order ``order``: the weights and scales present
    reordered (the weights into their own storage with ``in_place``), the rest as they are."""
    if check_order(order) == "rows":
        return stored
    out = dict(stored)
    for name in ("w13_weight", "w2_weight"):
        if name in out:
            out[name] = CHUNK_ORDERS[order][0](out[name], out=out[name] if in_place else None)
    for name, rows in SCALE_ROWS_PER_TILE.items():
        if name in out:
            out[name] = quad_scales(out[name], rows)
    return out


def rows_order(stored: dict[str, torch.Tensor], order: str) -> dict[str, torch.Tensor]:
    """Inverse of :func:`in_order`: the layout's tensors in byte order ``order`` -> in the ``"rows"`` order."""
    if check_order(order) == "rows":
        return stored
    out = dict(stored)
    for name in ("w13_weight", "w2_weight"):
        if name in out:
            out[name] = CHUNK_ORDERS[order][1](out[name])
    for name, rows in SCALE_ROWS_PER_TILE.items():
        if name in out:
            out[name] = scales_from_quad(out[name], rows)
    return out


def from_row_major(stored: dict[str, torch.Tensor], order: str = "rows") -> dict[str, torch.Tensor]:
    """The layout's tensors, in byte order ``order``, from padded row-major ones: w13 rows ``[gate | up]``, every
    row's bytes in order (how benchmarks build random layers on the GPU; biases are the same in both). Needs w13's
    weights and scales and w2's weights; w2's scales (the same row-major in the order ``"rows"``) where present."""
    check_order(order)
    w13, s13, w2 = stored["w13_weight"], stored["w13_weight_scale"], stored["w2_weight"]
    E, N2, kb = w13.shape
    Ip, Hp = N2 // 2, w2.shape[1]
    out = stored | {
        "w13_weight": k_tiled(
            gate_up_from_halves(w13).view(E, Ip // GATE_UP_TILE, GATE_UP_TILE, 2, kb), Ip // GATE_UP_TILE, kb
        ),
        "w13_weight_scale": gate_up_tiles(gate_up_from_halves(s13), Ip, s13.shape[2]),
        "w2_weight": k_tiled(
            w2.view(E, Hp // DOWN_TILE_ROWS, DOWN_TILE_ROWS, 1, w2.shape[2]), Hp // DOWN_TILE_ROWS, w2.shape[2]
        ),
    }
    return in_order(out, order, in_place=True)  # k_tiled's outputs are ours to overwrite


def to_row_major(stored: dict[str, torch.Tensor], order: str = "rows") -> dict[str, torch.Tensor]:
    """Inverse of :func:`from_row_major` (the same ``order``): each matrix row-major, w13 rows ``[gate | up]`` (for
    references); w2's scales converted where present."""
    E, N2, kb = stored["w13_weight"].shape
    rows = rows_order(stored, order)
    w13, w2 = rows["w13_weight"], rows["w2_weight"]
    scales = {name: rows[name] for name in SCALE_ROWS_PER_TILE if name in rows}
    halves = {
        "w13_weight": gate_up_halves_padded(k_untiled(w13, (GATE_UP_TILE, 2)).reshape(E, N2, kb), N2 // 2, kb),
        "w13_weight_scale": gate_up_halves_padded(
            gate_up_untiled(scales["w13_weight_scale"]), N2 // 2, scales["w13_weight_scale"].shape[2]
        ),
    }
    return stored | scales | halves | {"w2_weight": k_untiled(w2, (DOWN_TILE_ROWS, 1)).reshape(w2.shape)}


class StridedLayout(ExpertLayout):
    name = "strided"
    description = (
        "mxrepack Triton kernels (no TMA): packed FP4 in row tiles (w13: 32 gate then 32 up rows; w2: 16 rows), "
        "each K-tiled [rows/R, Kp/128, R, 64]; E8M0 scales [rows, K/32] in the same row order; hidden/intermediate "
        "padded to the tile; fp32 biases [gate|up]"
    )
    ORDER_DESCRIPTIONS = {
        "rows": "; order rows: each K tile's rows in order, scales row-major (sm80 and newer, sm_12x included)",
        "wgmma": (
            "; order wgmma: each 16-row x 64-byte piece of a K tile in Hopper wgmma's A-fragment order (each word's "
            "bits placed for a rotate-and-mask decode), the scales "
            "tiled likewise, 64 per piece in quad order (sm_90 H100/H200 only: sm_12x's mma.sync fragment differs, "
            "these bytes decode wrong there)"
        ),
        "mma2": (
            "; order mma2: each 16-row x 64-byte piece of a K tile in the mma.sync A-operand order of a packed "
            "decode (kWidth 8: 4 consecutive bytes of one row per word; each word's bits placed as in order wgmma), "
            "the scales tiled likewise, 64 per piece in quad order (sm_12x and sm_80-89; not sm_90, where Triton "
            "builds wgmma)"
        ),
    }

    def __init__(self, tile: int = 128, order: str = "rows"):
        if not isinstance(tile, int) or tile % 128 or tile <= 0:
            # whole 128-code K tiles, and whole row tiles (intermediate % 32, hidden % 16)
            raise MxRepackError(f"strided option tile={tile!r}: expected a positive multiple of 128")
        self.tile = tile
        self.order = check_order(order)
        self.description = StridedLayout.description + self.ORDER_DESCRIPTIONS[order]

    def padded(self, d: ExpertDims) -> tuple[int, int]:
        return round_up(d.hidden, self.tile), round_up(d.intermediate, self.tile)

    def outputs(self, d: ExpertDims) -> list[OutputSpec]:
        Hp, Ip = self.padded(d)
        chunked = CHUNK_ORDERS.get(self.order)

        def fp32_column(bias):
            return bias.to(torch.float32).unsqueeze(-1)

        def ordered(tiled):  # k_tiled's output, reordered in place
            return chunked[0](tiled, out=tiled) if chunked else tiled

        def ordered_scales(rows, name):
            return quad_scales(rows, SCALE_ROWS_PER_TILE[name]) if chunked else rows

        def w13(gate_up_proj_blocks):
            x = gate_up_proj_blocks.flatten(2)  # [E, 2I, H/2], gate/up rows interleaved
            E, I2, kb = x.shape
            rows = x.reshape(E, I2 // 2 // GATE_UP_TILE, GATE_UP_TILE, 2, kb)
            return ordered(k_tiled(rows, Ip // GATE_UP_TILE, Hp // 2))

        def w2(down_proj_blocks):
            x = down_proj_blocks.flatten(2)  # [E, H, I/2]
            E, H, kb = x.shape
            rows = x.reshape(E, H // DOWN_TILE_ROWS, DOWN_TILE_ROWS, 1, kb)
            return ordered(k_tiled(rows, Hp // DOWN_TILE_ROWS, Ip // 2))

        return packed_expert_outputs(
            d,
            Hp,
            Ip,
            {
                "w13_weight": w13,
                "w13_weight_scale": lambda gate_up_proj_scales: ordered_scales(
                    gate_up_tiles(gate_up_proj_scales, Ip, Hp // 32), "w13_weight_scale"
                ),
                "w13_bias": lambda gate_up_proj_bias: gate_up_halves_padded(
                    fp32_column(gate_up_proj_bias), Ip, 1
                ).squeeze(-1),
                "w2_weight": w2,
                "w2_weight_scale": lambda down_proj_scales: ordered_scales(
                    pad_rows_cols(down_proj_scales, Hp, Ip // 32), "w2_weight_scale"
                ),
                "w2_bias": lambda down_proj_bias: pad_rows_cols(fp32_column(down_proj_bias), Hp, 1).squeeze(-1),
            },
            torch.float32,
            UPSTREAM,
        )

    def unpack_padded(self, stored: dict[str, torch.Tensor], d: ExpertDims) -> dict[str, torch.Tensor]:
        rows = rows_order(stored, self.order)
        s13, s2 = rows["w13_weight_scale"], rows["w2_weight_scale"]
        w13 = k_untiled(rows["w13_weight"], (GATE_UP_TILE, 2))  # [E, Ip/32, 32, 2, Hp/2]
        w2 = k_untiled(rows["w2_weight"], (DOWN_TILE_ROWS, 1))
        E = w13.shape[0]
        return {
            "gate_up_proj_blocks": w13.reshape(E, -1, w13.shape[-1] // 16, 16),
            "gate_up_proj_scales": gate_up_untiled(s13),
            "gate_up_proj_bias": gate_up_from_halves(stored["w13_bias"].unsqueeze(-1)).squeeze(-1).to(torch.bfloat16),
            "down_proj_blocks": w2.reshape(E, -1, w2.shape[-1] // 16, 16),
            "down_proj_scales": s2,
            "down_proj_bias": stored["w2_bias"].to(torch.bfloat16),
        }


LAYOUT = StridedLayout()
