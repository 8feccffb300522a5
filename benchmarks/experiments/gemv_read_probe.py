"""How fast can lm_head's packed MXFP4 bytes be *read* on this GPU, with no decoding? (issue 4 probe)

Three read-only kernels over the 201088 x 1440-byte weight (plus its 90-byte scale rows), each reduced
to one int32 per program so that the compiler keeps every load:
* ``tiles``: the GEMV's access pattern, [BLOCK_N rows, BLOCK_K/32 groups, 4 words] per step;
* ``rows``: each program streams whole rows in order, 16 bytes per thread per load;
* ``flat``: the tensor as one contiguous range, 16 bytes per thread per load.
If ``tiles`` reaches what ``flat`` does, the GEMV's ceiling is its instruction stream, not its access
pattern. Timed in a CUDA graph like the decode benchmarks; weights rotate so that nothing runs from L2.
"""

import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common
from common import DEV, bench_decode, copy_roofline, rand_mx, rotating  # noqa: E402


@triton.jit
def _tiles(w_ptr, s_ptr, out_ptr, N, K, stride_wn, stride_sn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    G: tl.constexpr = BLOCK_K // 32
    rn = tl.minimum(tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N), N - 1)
    rg = tl.arange(0, G)
    w_ptrs = (
        w_ptr.to(tl.pointer_type(tl.int32))
        + tl.multiple_of(rn * (stride_wn // 4), 4)[:, None, None]
        + rg[None, :, None] * 4
        + tl.arange(0, 4)[None, None, :]
    )
    s_ptrs = s_ptr + rn[:, None] * stride_sn + rg[None, :]
    acc = tl.zeros((BLOCK_N, G, 4), dtype=tl.int32)
    sacc = tl.zeros((BLOCK_N, G), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        ok = rg < (K - k0) // 32
        acc ^= tl.load(w_ptrs, mask=ok[None, :, None], other=0)
        sacc ^= tl.load(s_ptrs, mask=ok[None, :], other=0).to(tl.int32)
        w_ptrs += BLOCK_K // 8
        s_ptrs += G
    tl.store(
        out_ptr + tl.program_id(0),
        tl.xor_sum(tl.xor_sum(tl.xor_sum(acc, 2), 1), 0) ^ tl.xor_sum(tl.xor_sum(sacc, 1), 0),
    )


@triton.jit
def _flat(w_ptr, out_ptr, n_words, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * BLOCK * STEPS
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    p = w_ptr.to(tl.pointer_type(tl.int32))
    for i in range(STEPS):
        o = base + i * BLOCK + offs
        acc ^= tl.load(p + o, mask=o < n_words, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, 0))


def main() -> None:
    N, K = 201088, 2880
    nbytes = N * K // 2 + N * K // 32
    nxt = rotating(lambda: rand_mx(N, K), nbytes)
    copy_bw = copy_roofline()
    out = torch.empty(1 << 20, dtype=torch.int32, device=DEV)
    rows = [{"device": torch.cuda.get_device_name(), "triton": triton.__version__, "copy_TBps": copy_bw / 1e12}]

    def timed(fn):
        return bench_decode(lambda: fn(*nxt()), rep=50)

    ms = timed(lambda w, s: w.view(torch.int32).sum(dtype=torch.int32))
    rows.append({"kernel": "torch_sum_int32", "ms": ms})
    for bn, bk, warps in itertools.product((8, 16, 32, 64), (128, 256, 512), (4, 8)):
        grid = (triton.cdiv(N, bn),)
        ms = timed(
            lambda w, s: _tiles[grid](
                w, s, out, N, K, w.stride(0), s.stride(0), BLOCK_N=bn, BLOCK_K=bk, num_warps=warps
            )
        )
        rows.append({"kernel": f"tiles n{bn}k{bk}w{warps}", "ms": ms})
    n_words = N * K // 8
    for block, steps, warps in itertools.product((512, 1024, 2048), (4, 16), (4, 8)):
        grid = (triton.cdiv(n_words, block * steps),)
        ms = timed(lambda w, s: _flat[grid](w, out, n_words, BLOCK=block, STEPS=steps, num_warps=warps))
        rows.append({"kernel": f"flat b{block}s{steps}w{warps}", "ms": ms})
    for r in rows[1:]:
        r["TBps"] = (
            nbytes / (r["ms"] * 1e-3) / 1e12
            if "torch" not in r["kernel"] and "flat" not in r["kernel"]
            else (N * K // 2) / (r["ms"] * 1e-3) / 1e12
        )
        r["roofline_frac"] = r["TBps"] * 1e12 / copy_bw
    for r in sorted(rows[1:], key=lambda r: -r["roofline_frac"])[:12] + [
        r for r in rows[1:] if r["kernel"].startswith("torch")
    ]:
        print(f"{r['kernel']:24s} {r['ms']:.4f} ms {r['TBps']:.2f} TB/s {100 * r['roofline_frac']:.0f}%", flush=True)
    print(f"copy roofline {copy_bw / 1e12:.2f} TB/s (read + write)")
    if len(sys.argv) > 1:
        json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
