"""Whole-model repack vs a plain `cp` of the same input files, with peak RSS. Not a test.

    python benchmarks/bench_repack.py --preset 120b --layers 4 --targets mxfp4,bf16 --workdir /tmp/mxbench

Makes a synthetic checkpoint of real gpt-oss shapes (kept between runs), then for each target runs
`repack` in a child process and `cp -r` of the same files, and reports wall time, the ratio
repack/cp, source GB/s and the child's peak RSS (from wait4). Prints a Markdown table and writes JSON
next to the workdir.

Page cache (``--cache``): ``warm`` (default) reads the source once, untimed, so both `cp` and `repack`
read it from memory -- the CPU-bound case. ``cold`` evicts the source files' pages
(``posix_fadvise(DONTNEED)``, no root needed) so both read from disk -- the user's case, where a 65 GB
checkpoint cannot sit in a 24 GB machine's cache. In both modes dirty pages of earlier runs are
flushed (``sync``) before each timed command. ``repack`` fsyncs every shard before it renames its
output, so each row also gives ``cp`` followed by an fsync of the copied files (``cp+sync s``).

``--source-form hub-cache`` lays the same files out as huggingface_hub's cache (blobs named by their
sha256, snapshot links) and converts by repo id, offline -- the user's ``repack openai/gpt-oss-120b``
path, where the source hashes come from the Hub's content addresses instead of a second pass.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mxrepack.repack.safetensors_io import sha256_file  # noqa: E402


def run_child(cmd: list[str], env: dict | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS bytes of one child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return wall, usage.ru_maxrss * 1024


def warm(path: Path) -> None:
    for f in sorted(path.iterdir()):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass


def evict(path: Path) -> None:
    """Drop ``path``'s files from the page cache (clean pages only: call after ``sync``)."""
    for f in sorted(path.iterdir()):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def prepare_cache(path: Path, mode: str) -> None:
    subprocess.run(["sync"], check=True)
    warm(path) if mode == "warm" else evict(path)


def hub_cache(src: Path, cache: Path, repo_id: str) -> Path:
    """``src``'s files as a Hub cache entry (hashed once, untimed); returns the snapshot directory."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / ("0" * 40)
    if snap.is_dir():
        return snap
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text("0" * 40)
    for f in sorted(src.iterdir()):
        digest = sha256_file(f)
        os.link(f, repo / "blobs" / digest)  # same bytes, no copy
        os.symlink(os.path.relpath(repo / "blobs" / digest, snap), snap / f.name)
    return snap


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="120b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--targets", default="mxfp4,bf16")
    ap.add_argument("--workdir", default="/tmp/mxbench")
    ap.add_argument("--out", default=None, help="JSON results file")
    ap.add_argument("--source-form", choices=("dir", "hub-cache"), default="dir")
    ap.add_argument("--cache", choices=("warm", "cold"), default="warm", help="source in the page cache, or evicted")
    ap.add_argument("--dense", default=None, help="passed to repack --dense (e.g. bf16: a pure re-layout of sm121)")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="(cp, repack) pairs per target, one after the other; the table shows medians (the disk's "
        "speed drifts, so each ratio is taken within its pair)",
    )
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"{args.preset}-L{args.layers}"
    repack = [sys.executable, "-m", "mxrepack.cli"]
    if not (src / "config.json").exists():
        t, _ = run_child(
            [*repack, "make-fixture", str(src), "--preset", args.preset, "--layers", str(args.layers), "--overwrite"]
        )
        print(f"made {src} in {t:.1f} s", file=sys.stderr)
    src_bytes = sum(f.stat().st_size for f in src.iterdir())
    source_arg, env = str(src), dict(os.environ)
    if args.source_form == "hub-cache":
        repo_id = f"mxbench/gpt-oss-{args.preset}-L{args.layers}"
        hub_cache(src, work / "hub", repo_id)
        source_arg = repo_id
        env.update(HF_HUB_CACHE=str(work / "hub"), HF_HUB_OFFLINE="1")
    rows = []
    for target in args.targets.split(","):
        pairs = []
        for _ in range(args.repeat):
            dst_cp = work / "cp-copy"
            shutil.rmtree(dst_cp, ignore_errors=True)
            prepare_cache(src, args.cache)
            cp_s, cp_rss = run_child(["cp", "-r", str(src), str(dst_cp)])
            t0 = time.perf_counter()
            subprocess.run(["sync", *map(str, sorted(dst_cp.iterdir()))], check=True)  # fsync each copied file
            cp_sync_s = cp_s + time.perf_counter() - t0
            shutil.rmtree(dst_cp)
            out = work / f"out-{target}"
            prepare_cache(src, args.cache)
            dense = ["--dense", args.dense] if args.dense else []
            rp_s, rp_rss = run_child(
                [*repack, source_arg, "--target", target, *dense, "--out", str(out), "--overwrite", "--json"], env
            )
            out_bytes = sum(f.stat().st_size for f in out.iterdir())
            shutil.rmtree(out)
            pairs.append(
                {
                    "cp_s": cp_s,
                    "cp_sync_s": cp_sync_s,
                    "repack_s": rp_s,
                    "ratio": rp_s / cp_s,
                    "ratio_vs_cp_sync": rp_s / cp_sync_s,
                    "peak_rss_MB": rp_rss / 1e6,
                }
            )
        med = {k: statistics.median(p[k] for p in pairs) for k in pairs[0]}
        med["peak_rss_MB"] = max(p["peak_rss_MB"] for p in pairs)
        rows.append(
            {
                "target": target,
                "dense": args.dense,
                "source_form": args.source_form,
                "cache": args.cache,
                "source_GB": src_bytes / 1e9,
                "output_GB": out_bytes / 1e9,
                **med,
                "source_GBps": src_bytes / 1e9 / med["repack_s"],
                "pairs": pairs,
            }
        )
    info = {
        "date": date.today().isoformat(),
        "machine": f"{platform.node()} {os.cpu_count()} cores",
        "preset": args.preset,
        "layers": args.layers,
        "rows": rows,
    }
    Path(args.out or work / "bench_repack.json").write_text(json.dumps(info, indent=2))
    print(
        f"cache: {args.cache}"
        + (f"; medians of {args.repeat} (cp, repack) pairs, peak RSS the largest" if args.repeat > 1 else "")
    )
    print(
        "| target | source GB | output GB | cp s | cp+sync s | repack s | repack/cp | repack/(cp+sync) | source GB/s "
        "| peak RSS MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['target']} | {r['source_GB']:.2f} | {r['output_GB']:.2f} | {r['cp_s']:.1f} | {r['cp_sync_s']:.1f} | "
            f"{r['repack_s']:.1f} | {r['ratio']:.2f} | {r['ratio_vs_cp_sync']:.2f} | {r['source_GBps']:.2f} | "
            f"{r['peak_rss_MB']:.0f} |"
        )


if __name__ == "__main__":
    main()
