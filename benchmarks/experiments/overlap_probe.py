"""How Triton places the wgmma waits of a swapped MXFP4 step, and what it costs in SASS, by the shape of the step:
two dots on even/odd codes (shipped; with and without ``dequant_mxfp4.mma_done``) against one dot on the natural K
order (the even/odd decode joined, or a natural-pair decode). A one-projection loop like the swapped kernels', compiled
for sm_90a with the local Triton: CPU only, no GPU.

    python benchmarks/experiments/overlap_probe.py BLOCK_M BLOCK_N WARPS STAGES VARIANTS   # e.g. 16 64 4 3 0,1,2,3,4,5

Variants: 0 two dots + mma_done (shipped), 1 two dots (the race, triton#9433), 2 one dot on the joined even/odd
decode, 3 the same + mma_done, 4 one dot on a natural-pair decode, 5 the same + mma_done. Printed per variant: the
wgmma commit/wait sequence in the loop's PTX, check.wgmma_left_in_flight, and the loop's SASS opcode counts.
"""

import sys
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sass_vs_triton_kernels import loop_counts  # noqa: E402 - beside this script

from mxrepack.kernels import check  # noqa: E402
from mxrepack.kernels.dequant_mxfp4 import dequant_pairs, e8m0_to_bf16_folded, mma_done  # noqa: E402

# one byte -> its two codes as a natural bf16 pair (low nibble, high nibble), times the folded scale; 4 elements (two
# bytes, each given twice) per call

NATURAL_FOLDED = tl.constexpr("""{
.reg .b32 z, y, t, m;
mov.b32 m, 0x80008000;
shl.b32 z, $2, 4;
prmt.b32 y, z, $2, 0x5000;
and.b32 t, y, 0x70007000;
shr.b32 t, t, 6;
lop3.b32 $0, y, t, 0x80008000, 0xEC;
fma.rn.bf16x2 $0, $0, $3, m;
prmt.b32 y, z, $2, 0x7020;
and.b32 t, y, 0x70007000;
shr.b32 t, t, 6;
lop3.b32 $1, y, t, 0x80008000, 0xEC;
fma.rn.bf16x2 $1, $1, $4, m;
}""")


@triton.jit
def natural(w, ws, BLOCK_N: tl.constexpr):
    """bytes [BN, 64] + scales [BN, 4] -> bf16 [BN, 128] in natural K order"""
    w2 = tl.reshape(tl.join(w, w), (BLOCK_N, 128))
    s = e8m0_to_bf16_folded(ws)
    s2 = tl.reshape(tl.broadcast_to(s[:, :, None], (BLOCK_N, 4, 32)), (BLOCK_N, 128))
    return tl.inline_asm_elementwise(NATURAL_FOLDED, "=r,=r,r,r,r", [w2, s2], dtype=tl.bfloat16, is_pure=True, pack=4)


@triton.jit
def probe(
    x_ptr,
    w_ptr,
    ws_ptr,
    y_ptr,
    K,
    stride_x,
    stride_w,
    stride_ws,
    stride_y,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VARIANT: tl.constexpr,
):
    rm = tl.arange(0, BLOCK_M)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rkb = tl.arange(0, 64)
    rks = tl.arange(0, 4)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, 128):
        w = tl.load(w_ptr + rn[:, None] * stride_w + (k0 // 2 + rkb)[None, :])
        ws = tl.load(ws_ptr + rn[:, None] * stride_ws + (k0 // 32 + rks)[None, :])
        if VARIANT >= 4:
            wk = natural(w, ws, BLOCK_N)
            a = tl.load(x_ptr + rm[:, None] * stride_x + (k0 + tl.arange(0, 128))[None, :])
            acc = tl.dot(wk, tl.trans(a), acc)
            if VARIANT == 5:
                acc = mma_done(acc)
        else:
            even, odd = dequant_pairs(w, ws, BLOCK_N, 128, "asm-fold")
        if VARIANT == 0 or VARIANT == 1:  # two dots on split-order activations
            a_even = tl.load(x_ptr + rm[:, None] * stride_x + (k0 + rkb)[None, :])
            a_odd = tl.load(x_ptr + rm[:, None] * stride_x + (k0 + 64 + rkb)[None, :])
            acc = tl.dot(even, tl.trans(a_even), acc)
            acc = tl.dot(odd, tl.trans(a_odd), acc)
            if VARIANT == 0:
                acc = mma_done(acc)
        elif VARIANT == 2 or VARIANT == 3:  # one dot: (even_j, odd_j) joined is the natural K order
            wk = tl.reshape(tl.join(even, odd), (BLOCK_N, 128))
            a = tl.load(x_ptr + rm[:, None] * stride_x + (k0 + tl.arange(0, 128))[None, :])
            acc = tl.dot(wk, tl.trans(a), acc)
            if VARIANT == 3:
                acc = mma_done(acc)
    tl.store(y_ptr + rn[:, None] * stride_y + rm[None, :], acc)


SIGNATURE = {
    "x_ptr": "*bf16",
    "w_ptr": "*u8",
    "ws_ptr": "*u8",
    "y_ptr": "*fp32",
    "K": "i32",
    "stride_x": "i32",
    "stride_w": "i32",
    "stride_ws": "i32",
    "stride_y": "i32",
    "BLOCK_M": "constexpr",
    "BLOCK_N": "constexpr",
    "VARIANT": "constexpr",
}


def main() -> None:
    block_m, block_n, warps, stages = (int(a) for a in sys.argv[1:5])
    for variant in (int(v) for v in sys.argv[5].split(",")):
        src = check.specialized(
            ASTSource(probe, SIGNATURE, {"BLOCK_M": block_m, "BLOCK_N": block_n, "VARIANT": variant})
        )
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
        ptx = k.asm["ptx"]
        waits = [
            line.split()[0].removeprefix("wgmma.").split(".")[0] + (" " + line.split()[-1] if "wait" in line else "")
            for line in (raw.strip() for raw in ptx.splitlines())
            if line.startswith("wgmma.") and "group" in line
        ]
        counts = loop_counts(k.asm["cubin"])
        ops = counts["loop_ops"]
        print(
            f"V{variant}: wgmma groups {waits}, left in flight (check's count) {check.wgmma_left_in_flight(ptx)}, "
            f"loop {counts['loop']} instructions, PRMT {ops.get('PRMT', 0)}, LDS {ops.get('LDS', 0)}, "
            f"STS {ops.get('STS', 0)}, top {list(ops.items())[:6]}",
            flush=True,
        )


if __name__ == "__main__":
    main()
