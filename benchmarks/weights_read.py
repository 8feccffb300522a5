"""Reading a checkpoint onto the GPU: safetensors' own reader (what vLLM's default loader does per tensor) against the
plugin's reader (mxrepack.serve.reader: threads, page-locked staging slots, tensors handed out on the GPU), each tensor
copied into a GPU tensor of its own as vLLM's weight loaders do; then every tensor compared with safetensors' bytes.
Warm page cache, the same files, the same run. Not a test.

    python benchmarks/weights_read.py --gib 8 --json out.json   # GPU machine (with vLLM: its threaded reader too)

The synthetic shards hold gpt-oss-120b's checkpoint tensors in its order (``mxrepack.gptoss``: per layer attention
BF16, router, the experts' MXFP4 blocks and scales, biases, norms; embedding and lm_head BF16 201088 x 2880), whole
layers making ``--gib`` GiB. (Until b08b132's record: a hand-written subset with q/k/v fused.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mxrepack import gptoss  # noqa: E402
from mxrepack.repack.fixture import fixture_config  # noqa: E402
from mxrepack.serve.reader import read_tensors  # noqa: E402


def nbytes(shape, dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def plan(gib: float) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """gpt-oss-120b's checkpoint tensors (``gptoss.expected_tensors``: names, shapes, dtypes, order), as many whole
    layers as make ``gib`` GiB with the embedding, lm_head and final norm."""

    def tensors(layers: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        dims = gptoss.Dims.from_config(fixture_config("120b", layers=layers))
        return [(n, s, gptoss.KIND_DTYPES[k][0]) for n, (s, k) in gptoss.expected_tensors(dims).items()]

    one = tensors(1)
    layer = sum(nbytes(s, d) for n, s, d in one if n.startswith("model.layers."))
    rest = sum(nbytes(s, d) for n, s, d in one) - layer
    return tensors(max(1, math.ceil((gib * 2**30 - rest) / layer)))


def make_shards(folder: Path, gib: float, shard_gib: float = 4.0) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files, shard, size = [], {}, 0
    for name, shape, dtype in plan(gib) + [(None, None, None)]:
        if name is None or (shard and size + nbytes(shape, dtype) > shard_gib * 2**30):
            path = folder / f"model-{len(files):05d}.safetensors"
            if not path.exists():
                save_file(shard, path)
            files.append(path)
            shard, size = {}, 0
        if name is not None:
            shard[name] = position_dependent(nbytes(shape, dtype), len(files) * 1000 + len(shard)).view(dtype)
            shard[name] = shard[name].reshape(shape)
            size += nbytes(shape, dtype)
    return files


def position_dependent(n: int, seed: int) -> torch.Tensor:
    """``n`` bytes that differ from chunk to chunk of any power-of-two size (a random block of prime length, tiled and
    shifted by ``seed``): a chunk copied from the wrong place or a stale staging slot shows."""
    block = torch.randint(0, 256, (1_000_003,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    return block.roll(seed).repeat(-(-n // block.numel()))[:n]


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def safetensors_tensors(files):
    """What vLLM's default reader yields: safe_open + get_tensor per tensor, file by file."""
    for f in files:
        with safe_open(f, "pt") as h:
            for k in h.keys():
                yield k, h.get_tensor(k)


def timed(tensors, params) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for name, x in tensors:
        params[name].copy_(x)  # as vLLM's weight loaders: a blocking copy into the parameter
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", default="/root/weights_read")
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--commit")
    ap.add_argument("--json")
    args = ap.parse_args()
    files = make_shards(Path(args.folder), args.gib)
    total = sum(os.path.getsize(f) for f in files)
    for f in files:  # warm page cache
        with open(f, "rb") as h:
            while h.read(64 << 20):
                pass
    params = {}
    for name, x in safetensors_tensors(files):
        params[name] = torch.empty_like(x, device="cuda")
    pinned = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(4):
        dev.copy_(pinned)
    torch.cuda.synchronize()
    h2d = 4 * 2**30 / (time.perf_counter() - t)
    meta = {
        "date": date.today().isoformat(),
        "commit": args.commit,
        "device": torch.cuda.get_device_name(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "bytes": total,
        "tensors": len(params),
        "pinned_h2d_GBps": h2d / 1e9,
    }
    print(json.dumps(meta), flush=True)
    cases = {"safetensors (vLLM's default reader)": lambda: safetensors_tensors(files)}
    try:  # vLLM's own multithreaded reader (--model-loader-extra-config enable_multithread_load), where vLLM imports
        from vllm.model_executor.model_loader.weight_utils import multi_thread_safetensors_weights_iterator

        cases["vLLM multithreaded reader, 8 threads"] = lambda: multi_thread_safetensors_weights_iterator(
            [str(f) for f in files], False, 8
        )
    except ImportError:
        pass
    for threads in (4, 8, 16):
        for chunk_mib, slots in ((16, 16), (64, 8)):
            cases[f"mxrepack reader, {threads} threads, {slots} x {chunk_mib} MiB staging"] = (
                lambda threads=threads, chunk_mib=chunk_mib, slots=slots: read_tensors(
                    files, "cuda", threads, chunk_mib << 20, slots
                )
            )
    rows = []
    for name, make in cases.items():
        for p in params.values():
            p.zero_()
        times = [timed(make(), params) for _ in range(args.repeat)]
        differ = [k for k, x in safetensors_tensors(files) if not torch.equal(as_bytes(params[k]), as_bytes(x).cuda())]
        s = statistics.median(times)
        rows.append({"case": name, "s": times, "median_s": s, "GBps": total / s / 1e9, "tensors_differing": differ})
        print(
            f"{name:50s} {s:.3f} s  {total / s / 1e9:.2f} GB/s  runs {[round(x, 3) for x in times]}  "
            f"differing {len(differ)}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(meta | {"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
