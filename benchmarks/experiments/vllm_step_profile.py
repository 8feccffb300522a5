"""Where a decode step's time goes in vLLM with the plugin: torch.profiler over 16 greedy tokens of one sequence,
after a warm-up run. Prints the CUDA runtime calls the host made (graph launches against single kernel launches) and
the host ops and GPU kernels that took the most time. Not a test; a diagnostic for docs/SERVING.md.

    python benchmarks/experiments/vllm_step_profile.py MODEL [--env K=V ...] [--eager] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--env", action="append", default=[])
ap.add_argument("--eager", action="store_true")
ap.add_argument("--json")
args = ap.parse_args()
os.environ.update(dict(kv.split("=", 1) for kv in args.env))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402

llm = LLM(
    model=args.model,
    skip_tokenizer_init=True,
    enforce_eager=args.eager,
    max_model_len=256,
    max_num_seqs=4,
    gpu_memory_utilization=0.35,
    seed=0,
    compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128]},
)
sp = SamplingParams(temperature=0.0, max_tokens=16, detokenize=False, ignore_eos=True)
prompt = [{"prompt_token_ids": [(3 * j) % 5000 + 100 for j in range(24)]}]
llm.generate(prompt, sp, use_tqdm=False)
torch.cuda.synchronize()
t = time.perf_counter()
llm.generate(prompt, sp, use_tqdm=False)
torch.cuda.synchronize()
wall = time.perf_counter() - t
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    llm.generate(prompt, sp, use_tqdm=False)
    torch.cuda.synchronize()
runtime = collections.Counter()
kernels = collections.Counter()
kernel_us = collections.Counter()
host = collections.Counter()
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        kernels[e.name[:80]] += 1
        kernel_us[e.name[:80]] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    elif e.name.startswith(("cuda", "cu")):
        runtime[e.name] += 1
    else:
        host[e.name[:80]] += e.self_cpu_time_total
out = {
    "model": args.model,
    "env": args.env,
    "eager": args.eager,
    "ms_per_token_unprofiled": wall / 16 * 1e3,
    "runtime_calls": runtime.most_common(12),
    "kernels_by_count": kernels.most_common(25),
    "kernel_us": kernel_us.most_common(25),
    "host_self_us": host.most_common(30),
}
print(json.dumps(out, indent=1))
if args.json:
    open(args.json, "w").write(json.dumps(out, indent=1))
