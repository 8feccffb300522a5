"""Does cuBLASLt hold a faster algorithm than torch's default for the dense prefill GEMMs?

The chunk orders' prefill is a dequantization to BF16 and then torch's ``x @ W.T`` (cuBLAS's default pick). At 2048
rows it stays 1-3% short of cuBLAS BF16 on W itself (PERF.md): the dequantization is about 10% of the GEMM and does
not hide behind it (PERF_LOG stop 42). torch's TunableOp tunes nothing on CUDA but its default (its other GEMM
solutions are ROCm's), so whether another cuBLASLt algorithm runs these shapes faster is asked here directly: the
heuristic's first ``--algos`` candidates for each shape, each timed against torch's own call on the same tensors, and
checked against it.

    python benchmarks/experiments/cublaslt_algos_probe.py OUT.json [--algos 16] [--rows 2048,8192]

GPU machine only (ctypes onto the libcublasLt torch itself loaded). A faster algorithm here is a lever, not a change:
using it would take a cuBLASLt call of our own in ``linear_dequant_gemm``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
from datetime import date

import torch

CUDA_R_32F, CUDA_R_16BF = 0, 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
DESC_TRANSA, DESC_TRANSB = 3, 4
PREF_MAX_WORKSPACE_BYTES = 1
# cublasLtMatmulAlgoConfigAttributes_t: read back to say which kernel each candidate is
ALGO_CONFIG = {"id": 0, "tile": 1, "splitk": 2, "reduction": 3, "swizzle": 4, "custom": 5, "stages": 6, "cluster": 8}
WORKSPACE = 32 << 20
LAYERS = {"qkv": (5120, 2880), "o": (2880, 4096), "lm_head": (201088, 2880)}


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [
        ("algo", _Algo),
        ("workspaceSize", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("wavesCount", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


def _loaded_cublaslt() -> ctypes.CDLL:
    """The libcublasLt this process already mapped (torch's): the same library torch's own calls go through."""
    torch.randn(64, 64, device="cuda") @ torch.randn(64, 64, device="cuda")
    torch.cuda.synchronize()
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libcublasLt" in line}
    if not paths:
        raise SystemExit("no libcublasLt mapped in this process")
    return ctypes.CDLL(sorted(paths)[0])


def _ok(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what}: cublasStatus {status}")


class Gemm:
    """``y = x @ w.T`` (x [M, K], w [N, K], y [M, N], BF16, fp32 accumulation) through cuBLASLt, as torch lays it
    out: column-major C [N, M] = op(A) op(B) with A = w read as [K, N] transposed and B = x read as [K, M]."""

    def __init__(self, lib: ctypes.CDLL, m: int, n: int, k: int):
        self.lib, self.m, self.n, self.k = lib, m, n, k
        self.handle = ctypes.c_void_p()
        _ok(lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.desc = ctypes.c_void_p()
        _ok(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), CUBLAS_COMPUTE_32F, CUDA_R_32F), "DescCreate")
        for attr, op in ((DESC_TRANSA, CUBLAS_OP_T), (DESC_TRANSB, CUBLAS_OP_N)):
            v = ctypes.c_int32(op)
            _ok(lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(v), 4), "DescSetAttribute")
        self.a, self.b, self.c = (self._layout(r, c) for r, c in ((k, n), (k, m), (n, m)))
        self.pref = ctypes.c_void_p()
        _ok(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(self.pref)), "PreferenceCreate")
        ws = ctypes.c_uint64(WORKSPACE)
        _ok(
            lib.cublasLtMatmulPreferenceSetAttribute(self.pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws), 8),
            "PreferenceSetAttribute",
        )
        self.workspace = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def _layout(self, rows: int, cols: int) -> ctypes.c_void_p:
        layout = ctypes.c_void_p()
        _ok(
            self.lib.cublasLtMatrixLayoutCreate(
                ctypes.byref(layout), CUDA_R_16BF, ctypes.c_uint64(rows), ctypes.c_uint64(cols), ctypes.c_int64(rows)
            ),
            "MatrixLayoutCreate",
        )
        return layout

    def candidates(self, count: int) -> list[_Heuristic]:
        results = (_Heuristic * count)()
        returned = ctypes.c_int(0)
        _ok(
            self.lib.cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                self.desc,
                self.a,
                self.b,
                self.c,
                self.c,
                self.pref,
                count,
                results,
                ctypes.byref(returned),
            ),
            "AlgoGetHeuristic",
        )
        return [results[i] for i in range(returned.value) if results[i].state == 0]

    def config(self, h: _Heuristic) -> dict:
        out = {}
        for name, attr in ALGO_CONFIG.items():
            out[name] = None
            for ctype in (ctypes.c_uint32, ctypes.c_uint16):  # each attribute has its own width
                v, written = ctype(0), ctypes.c_size_t(0)
                status = self.lib.cublasLtMatmulAlgoConfigGetAttribute(
                    ctypes.byref(h.algo), attr, ctypes.byref(v), ctypes.sizeof(v), ctypes.byref(written)
                )
                if status == 0:
                    out[name] = v.value
                    break
        return out

    def run(self, h: _Heuristic, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> None:
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        _ok(
            self.lib.cublasLtMatmul(
                self.handle,
                self.desc,
                ctypes.byref(self.alpha),
                ctypes.c_void_p(w.data_ptr()),
                self.a,
                ctypes.c_void_p(x.data_ptr()),
                self.b,
                ctypes.byref(self.beta),
                ctypes.c_void_p(y.data_ptr()),
                self.c,
                ctypes.c_void_p(y.data_ptr()),
                self.c,
                ctypes.byref(h.algo),
                ctypes.c_void_p(self.workspace.data_ptr()),
                ctypes.c_size_t(WORKSPACE),
                stream,
            ),
            "cublasLtMatmul",
        )


def _time(fn, reps: int = 20, rounds: int = 7) -> float:
    """Median over rounds of the mean ms of ``reps`` back-to-back calls (each a full GEMM: launch cost negligible)."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--algos", type=int, default=16)
    ap.add_argument("--rows", default="2048,8192")
    ap.add_argument("--layers", default="qkv,o,lm_head")
    ap.add_argument("--turns", type=int, default=15, help="rounds of the interleaved timing")
    args = ap.parse_args()
    lib = _loaded_cublaslt()
    rec = {"date": date.today().isoformat(), "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    rec["cublaslt_version"] = lib.cublasLtGetVersion()
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for layer in args.layers.split(","):
        n, k = LAYERS[layer]
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
        for m in (int(r) for r in args.rows.split(",")):
            if layer == "lm_head" and m > 2048:
                continue
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
            ref = x @ w.T
            torch_ms = _time(lambda: torch.mm(x, w.T))
            gemm = Gemm(lib, m, n, k)
            y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            cands = []
            for i, h in enumerate(gemm.candidates(args.algos)):
                try:
                    gemm.run(h, x, w, y)
                    torch.cuda.synchronize()
                    err = ((y.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                    ms = _time(lambda h=h: gemm.run(h, x, w, y))
                    cands.append(
                        {
                            "rank": i,
                            "ms": ms,
                            "rel_err_vs_torch": err,
                            "waves": h.wavesCount,
                            "workspace": h.workspaceSize,
                            **gemm.config(h),
                        }
                    )
                except RuntimeError as e:
                    cands.append({"rank": i, "error": str(e)})
            torch_again = _time(lambda: torch.mm(x, w.T))
            timed = [c for c in cands if "ms" in c]
            best = min(timed, key=lambda c: c["ms"]) if timed else None
            row = {"layer": layer, "M": m, "N": n, "K": k, "torch_ms": [torch_ms, torch_again], "candidates": cands}
            line = ""
            if best:
                row["best_rank"], row["best_ms"] = best["rank"], best["ms"]
                row["torch_over_best"] = min(torch_ms, torch_again) / best["ms"]
                # one pass over the candidates drifts (torch's own two timings above differ by up to 20% on some
                # shapes): the three fastest and torch again, taking turns, each round timing all four
                heur = dict(enumerate(gemm.candidates(args.algos)))
                top = sorted(timed, key=lambda c: c["ms"])[:3]
                calls = {"torch": lambda: torch.mm(x, w.T)}
                calls |= {f"#{c['rank']}": (lambda h=heur[c["rank"]]: gemm.run(h, x, w, y)) for c in top}
                turns: dict[str, list[float]] = {name: [] for name in calls}
                for _ in range(args.turns):
                    for name, fn in calls.items():
                        turns[name].append(_time(fn, reps=20, rounds=1))
                med = {name: statistics.median(v) for name, v in turns.items()}
                row["turns_ms"], row["turns_median_ms"] = turns, med
                row["torch_over_best_in_turns"] = med["torch"] / min(v for n_, v in med.items() if n_ != "torch")
                line = "\n   in turns, median ms: " + "  ".join(f"{n_} {v:.4f}" for n_, v in med.items())
                line += f"  torch/best {row['torch_over_best_in_turns']:.3f}"
            rows.append(row)
            print(
                f"{layer:8} M={m:5} torch {torch_ms:.4f}/{torch_again:.4f} ms  "
                + "  ".join(f"#{c['rank']} {c['ms']:.4f}" for c in timed[:8])
                + (f"  best #{best['rank']} {best['ms']:.4f} (torch/best {row['torch_over_best']:.3f})" if best else "")
                + line,
                flush=True,
            )
    rec["rows"] = rows
    with open(args.out, "w") as f:
        json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
