"""``strided``: the layout mxrepack's own Triton kernels consume (``mxrepack.kernels``), safe on sm_12x.

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
* scales ``[E, rows, K/32]`` raw E8M0 bytes, row-major, rows in the same order as the weights';
* biases float32 (the kernels add them to the fp32 accumulator), rows ``[gate(0:Ip) | up(Ip:2Ip)]`` and
  w2's rows in order (a kernel indexes them by output row).
"""

from __future__ import annotations

import torch

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

UPSTREAM = "mxrepack.kernels (moe_mxfp4 / linear_mxfp4 Triton kernels)"
GATE_UP_TILE = 32  # intermediate rows per w13 row tile: 32 gate rows, then the same 32 up rows
DOWN_TILE_ROWS = 16  # w2 rows per row tile
K_TILE_BYTES = 64  # packed bytes of one K tile (128 codes, four scale groups)


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


def from_row_major(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The layout's tensors from padded row-major ones: w13 rows ``[gate | up]``, every row's bytes in order
    (how benchmarks build random layers on the GPU; biases are the same in both)."""
    w13, s13, w2 = stored["w13_weight"], stored["w13_weight_scale"], stored["w2_weight"]
    E, N2, kb = w13.shape
    Ip, Hp = N2 // 2, w2.shape[1]
    return stored | {
        "w13_weight": k_tiled(
            gate_up_from_halves(w13).view(E, Ip // GATE_UP_TILE, GATE_UP_TILE, 2, kb), Ip // GATE_UP_TILE, kb
        ),
        "w13_weight_scale": gate_up_tiles(gate_up_from_halves(s13), Ip, s13.shape[2]),
        "w2_weight": k_tiled(
            w2.view(E, Hp // DOWN_TILE_ROWS, DOWN_TILE_ROWS, 1, w2.shape[2]), Hp // DOWN_TILE_ROWS, w2.shape[2]
        ),
    }


def to_row_major(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`from_row_major`: each matrix row-major, w13 rows ``[gate | up]`` (for references)."""
    E, N2, kb = stored["w13_weight"].shape
    halves = {
        name: gate_up_halves_padded(x, N2 // 2, x.shape[2])
        for name, x in (
            ("w13_weight", k_untiled(stored["w13_weight"], (GATE_UP_TILE, 2)).reshape(E, N2, kb)),
            ("w13_weight_scale", gate_up_untiled(stored["w13_weight_scale"])),
        )
    }
    w2 = stored["w2_weight"]
    return stored | halves | {"w2_weight": k_untiled(w2, (DOWN_TILE_ROWS, 1)).reshape(w2.shape)}


class StridedLayout(ExpertLayout):
    name = "strided"
    description = (
        "mxrepack Triton kernels (sm_12x-safe, no TMA): packed FP4 in row tiles (w13: 32 gate then 32 up "
        "rows; w2: 16 rows), each K-tiled [rows/R, Kp/128, R, 64]; row-major E8M0 scales in the same row "
        "order; hidden/intermediate padded to the tile; fp32 biases [gate|up]"
    )

    def __init__(self, tile: int = 128):
        if not isinstance(tile, int) or tile % 128 or tile <= 0:
            # whole 128-code K tiles, and whole row tiles (intermediate % 32, hidden % 16)
            raise MxRepackError(f"strided option tile={tile!r}: expected a positive multiple of 128")
        self.tile = tile

    def padded(self, d: ExpertDims) -> tuple[int, int]:
        return round_up(d.hidden, self.tile), round_up(d.intermediate, self.tile)

    def outputs(self, d: ExpertDims) -> list[OutputSpec]:
        Hp, Ip = self.padded(d)

        def fp32_column(bias):
            return bias.to(torch.float32).unsqueeze(-1)

        def w13(gate_up_proj_blocks):
            x = gate_up_proj_blocks.flatten(2)  # [E, 2I, H/2], gate/up rows interleaved
            E, I2, kb = x.shape
            return k_tiled(x.reshape(E, I2 // 2 // GATE_UP_TILE, GATE_UP_TILE, 2, kb), Ip // GATE_UP_TILE, Hp // 2)

        def w2(down_proj_blocks):
            x = down_proj_blocks.flatten(2)  # [E, H, I/2]
            E, H, kb = x.shape
            return k_tiled(x.reshape(E, H // DOWN_TILE_ROWS, DOWN_TILE_ROWS, 1, kb), Hp // DOWN_TILE_ROWS, Ip // 2)

        return packed_expert_outputs(
            d,
            Hp,
            Ip,
            {
                "w13_weight": w13,
                "w13_weight_scale": lambda gate_up_proj_scales: gate_up_tiles(gate_up_proj_scales, Ip, Hp // 32),
                "w13_bias": lambda gate_up_proj_bias: gate_up_halves_padded(
                    fp32_column(gate_up_proj_bias), Ip, 1
                ).squeeze(-1),
                "w2_weight": w2,
                "w2_weight_scale": lambda down_proj_scales: pad_rows_cols(down_proj_scales, Hp, Ip // 32),
                "w2_bias": lambda down_proj_bias: pad_rows_cols(fp32_column(down_proj_bias), Hp, 1).squeeze(-1),
            },
            torch.float32,
            UPSTREAM,
        )

    def unpack_padded(self, stored: dict[str, torch.Tensor], d: ExpertDims) -> dict[str, torch.Tensor]:
        w13 = k_untiled(stored["w13_weight"], (GATE_UP_TILE, 2))  # [E, Ip/32, 32, 2, Hp/2]
        w2 = k_untiled(stored["w2_weight"], (DOWN_TILE_ROWS, 1))
        E = w13.shape[0]
        return {
            "gate_up_proj_blocks": w13.reshape(E, -1, w13.shape[-1] // 16, 16),
            "gate_up_proj_scales": gate_up_untiled(stored["w13_weight_scale"]),
            "gate_up_proj_bias": gate_up_from_halves(stored["w13_bias"].unsqueeze(-1)).squeeze(-1).to(torch.bfloat16),
            "down_proj_blocks": w2.reshape(E, -1, w2.shape[-1] // 16, 16),
            "down_proj_scales": stored["w2_weight_scale"],
            "down_proj_bias": stored["w2_bias"].to(torch.bfloat16),
        }


LAYOUT = StridedLayout()
