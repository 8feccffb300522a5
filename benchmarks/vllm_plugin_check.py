"""Serve mxrepack outputs with a real vLLM on one GPU and compare them with stock vLLM on the source. Not a test.

    python benchmarks/vllm_plugin_check.py --work /root/vpc --json out.json [--cases a,b,...] [--layers 2]

Needs vLLM (on the lent GPU: ../shared/tools/vllm-kit, then the plugin's entry point made visible: see
docs/SERVING.md "Proof"). One run:

1. makes a gpt-oss checkpoint of real widths (``make_fixture("20b")``: hidden 2880, intermediate 2880, 32 experts, the
   real 201088-token vocabulary; ``--layers`` deep) and repacks it for each case's target or recipe;
2. starts ``vllm.LLM`` once per case, each in its own process (so each load's time and peak GPU memory are its own),
   in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: a failure's root cause lands in this log), eager mode
   (the ``-graphs`` cases: vLLM's default, torch.compile and CUDA graphs);
   records the time to ready, the weight phase (vLLM's ``load_model``: ``load_weights`` + process after loading, timed
   by wrapping vLLM's loader), the GPU memory the load peaked at above what was allocated before it, greedy tokens and
   the top-5 logprobs of every prompt position and generated token, and the decode speed of 64 greedy tokens for 1 and
   for 4 sequences (``--batches``; at 2 layers the host's step dominates it: tens of sequences and ``--layers 12``
   let the kernels set it), and for each decode run the process's CPU time a step, its preemptions, the core and
   clock of its main thread and the GPU's clocks, power and clock-event reasons (``GpuSampler``); with ``--profile``
   also 16 decode steps under torch.profiler (host against GPU time, graph launches, the costliest ops) of one
   sequence, or of ``--profile-batch`` sequences;
3. compares each case with its baseline (a case in ``CASES``: stock vLLM on the source, or another mxrepack case) and,
   where it ran, with stock vLLM's Marlin case of the same mode (``stock_case``): greedy tokens equal, and the largest
   |logprob difference| over the tokens both list;
4. ``_convert``: for every expert layout, the tensors the plugin hands to vLLM's kernel (the stored bytes, retyped as
   the plugin does) against vLLM's own ``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`` of the same source layer,
   run here (the Blackwell-only backends' kernels cannot run on Hopper; their conversions can); with ``--cases ''``
   (``--convert``) the conversions alone.

Each engine process is killed after ``--engine-timeout`` seconds (900), its case then an error row. On a GB10:
``benchmarks/gb10_check.sh`` runs the sm121 targets' cases and this machine's conversions.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mxrepack.serve.spec import DENSE_KERNEL_ENV  # noqa: E402  (no vLLM, no torch import)


def _prompt(i: int) -> list[int]:
    """The i-th 24-token prompt (token ids; distinct for i < 714)."""
    return [(7 * i + 3 * j) % 5000 + 100 for j in range(24)]


PROMPTS = [_prompt(i) for i in range(3)]
MAX_TOKENS = 8
TOP = 5

# Recipes of layouts that no built-in target carries (written into the work folder).
RECIPES = {
    "strided": {
        "name": "strided",
        "description": "strided experts on mxrepack's Triton kernels; BF16 dense",
        "experts": {"layout": "strided"},
        "dense": {"format": "bf16"},
        "config": {"quantization_config": "mxrepack"},
    },
    # sm121-strided's experts with BF16 dense layers: the mma2 order's MoE alone against stock
    "strided-mma2": {
        "name": "strided-mma2",
        "description": "strided experts in the mma2 order on mxrepack's Triton kernels; BF16 dense",
        "experts": {"layout": "strided", "options": {"order": "mma2"}},
        "dense": {"format": "bf16"},
        "config": {"quantization_config": "mxrepack"},
    },
    "marlin-dense": {
        "name": "marlin-dense",
        "description": "Marlin experts, MXFP4 q/k/v/o/lm_head (the sm121 dense)",
        "experts": {"layout": "marlin"},
        "dense": {"format": "mxfp4", "layers": ["qkv", "o", "lm_head"], "scale_rule": "ocp"},
        "config": {"quantization_config": "mxrepack"},
    },
    # the sm121 target's experts (laid out for vLLM's FLASHINFER_CUTLASS_MXFP4_MXFP8 MoE backend) with BF16 dense
    # layers: its MoE alone, against stock vLLM's own load-time conversion of the source for that backend
    "sm121-experts": {
        "name": "sm121-experts",
        "description": "the sm121 target's experts (flashinfer-cutlass) with BF16 dense layers",
        "experts": {"layout": "flashinfer-cutlass"},
        "dense": {"format": "bf16"},
        "config": {"quantization_config": "mxrepack"},
    },
    "ct-experts": {
        "name": "ct-experts",
        "description": "the compressed-tensors target's experts, BF16 attention",
        "experts": {"layout": "compressed-tensors", "options": {"pad_intermediate": 128}},
        "dense": {"format": "bf16"},
        "config": {"quantization_config": "compressed-tensors"},
    },
} | {
    # the sm121 dense weights in a chunk order (the dense layout's option: wgmma is sm90-strided's with --dense mxfp4,
    # mma2 sm121-strided's, run under DISABLE_MMA_V3 on a Hopper), beside Marlin experts as marlin-dense has them: only
    # the dense kernels differ from that case
    f"marlin-dense-{order}": {
        "name": f"marlin-dense-{order}",
        "description": f"Marlin experts, MXFP4 q/k/v/o/lm_head in the {order} order (mxrepack's dense tiles)",
        "experts": {"layout": "marlin"},
        "dense": {"format": "mxfp4", "layers": ["qkv", "o", "lm_head"], "scale_rule": "ocp", "order": order},
        "config": {"quantization_config": "mxrepack"},
    }
    for order in ("wgmma", "mma2")
}
_MT = {"enable_multithread_load": True, "num_threads": 8}
# vLLM's default serving mode (no enforce_eager): torch.compile, CUDA graphs at these batch sizes. The 3 prompts' 72
# tokens run padded to 128 in one graph, so the MoE tiles past 8 rows per expert (and their overlapped launches) and the
# dense kernels at 17-128 rows are captured too, not only the decode steps (3 sequences, padded to 4)
_GRAPHS = {"enforce_eager": False, "compilation_config": {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128]}}
_ENV = "_env"  # a case's environment for its engine process, not an LLM argument
DECODE_RUNS = 5  # timed generations per batch size, after the first
_PROFILE = "_profile"  # --profile: the engine profiles its decode steps, not an LLM argument
_BATCHES = "_batches"  # --batches: the sequence counts whose decode is timed, not an LLM argument
# a sleep level: after its first generation the engine sleeps at that level (1: weights offloaded to the CPU; 2: its
# GPU memory discarded), wakes, at level 2 reloads the weights from the checkpoint (as an RL trainer cycles it), and
# generates again. Not an LLM argument
_SLEEP = "_sleep"
# served by a Hub repo id, as a user serves a pushed output: the prebuilt folder made the snapshot of a made-up repo in
# an offline Hugging Face cache under the work folder (``_hub_cache``). Not an LLM argument
_HUB = "_hub"
_DENSE_TRITON = {DENSE_KERNEL_ENV: "mxrepack"}
# vLLM's moe_backend value for its FLASHINFER_CUTLASS_MXFP4_MXFP8 backend (FlashInfer's CUTLASS fused MoE, MXFP4
# weights x MXFP8 activations), 0.26 and 0.33 alike (oracle/mxfp4.py, map_mxfp4_backend). Plain "flashinfer_cutlass"
# maps to both activation variants and select_mxfp4_moe_backend keeps the BF16-activation one alone when nothing asks
# for an activation (_filter_by_activation), which FlashInferExperts runs on sm_90 only. The "_afp8" name is not in
# the MoEBackend literal (config/kernel.py): `--moe-backend` refuses it, LLM(moe_backend=...) passes it through.
# FlashInferExperts takes MXFP4 x MXFP8 on compute capability 10.0 and newer: refused on a Hopper
_FLASHINFER_CUTLASS_MXFP8 = "flashinfer_cutlass_afp8"
_MMA_V2 = {"DISABLE_MMA_V3": "1"}  # Triton builds mma.sync on a Hopper, as on sm_12x (the mma2 order needs it there)
# name: (target or recipe, LLM keyword arguments, baseline case, what is expected)
CASES = {
    "source-marlin": ("source", {"moe_backend": "marlin"}, None, "stock vLLM, Marlin MoE (the baseline)"),
    "source-triton": ("source", {"moe_backend": "triton"}, None, "stock vLLM, triton_kernels MoE (the baseline)"),
    "sm80": ("sm80", {}, "source-marlin", "bit-identical"),
    "sm121-marlin": ("sm121-marlin", {}, "source-marlin", "bit-identical"),
    "sm90": ("sm90", {}, "source-triton", "bit-identical"),
    "strided": ("strided", {}, "source-marlin", "within the kernels' bound (other kernels, fp32 accumulation)"),
    # the built-in target of the wgmma order (until 5e77940 an inline recipe of the same content)
    "strided-wgmma": ("sm90-strided", {}, "strided", "the same weights in the wgmma order: within the kernels' bound"),
    "marlin-dense-twin": (
        "marlin-dense-twin",
        {},
        None,
        "marlin-dense with its dense MXFP4 weights dequantized to BF16 (vLLM's BF16 linear)",
    ),
    "marlin-dense": ("marlin-dense", {}, "marlin-dense-twin", "within BF16 matmul rounding of its BF16 twin"),
    "bf16": ("bf16", {}, "source-marlin", "within BF16 matmul rounding"),
    "ct-experts": (
        "ct-experts",
        {"moe_backend": "marlin"},
        "source-marlin",
        "plugin: compressed-tensors experts into vLLM's gpt-oss MXFP4 method, Marlin: bit-identical",
    ),
    # vLLM's own multithreaded safetensors reading (DefaultModelLoader's extra config), for stock and plugin alike:
    # what the weight phase is when reading the files is no longer one thread's memcpy
    "source-marlin-mt": (
        "source",
        {"moe_backend": "marlin", "model_loader_extra_config": _MT},
        None,
        "stock vLLM, Marlin MoE, multithreaded load (the baseline)",
    ),
    "sm80-mt": ("sm80", {"model_loader_extra_config": _MT}, "source-marlin-mt", "bit-identical, multithreaded load"),
    # the plugin's reader (--load-format mxrepack: threads, page-locked staging, tensors handed out on the GPU), on the
    # plugin's target and, for what the reader alone is worth, on the source with stock vLLM's own MoE method
    "sm80-fast": ("sm80", {"load_format": "mxrepack"}, "source-marlin", "bit-identical, mxrepack reader"),
    "sm90-fast": ("sm90", {"load_format": "mxrepack"}, "source-triton", "bit-identical, mxrepack reader"),
    "strided-fast": (
        "strided",
        {"load_format": "mxrepack"},
        "strided",
        "bit-identical to the same target through vLLM's reader",
    ),
    "source-marlin-fast": (
        "source",
        {"moe_backend": "marlin", "load_format": "mxrepack"},
        "source-marlin",
        "stock vLLM's Marlin MoE on the source, mxrepack reader: bit-identical",
    ),
    "compressed-tensors": (
        "compressed-tensors",
        {"moe_backend": "marlin"},
        "source-marlin",
        "plugin experts + vLLM's compressed-tensors MXFP4 attention (Marlin): MXFP4 q/k/v/o error",
    ),
    # the sm121 dense bytes on mxrepack's dense kernels instead of vLLM's Marlin (the plugin's $MXREPACK_DENSE_KERNEL)
    "dense-mxrepack": (
        "marlin-dense",
        {_ENV: _DENSE_TRITON},
        "marlin-dense-twin",
        "within BF16 matmul rounding of its BF16 twin (as marlin-dense)",
    ),
    # as vLLM serves by default: torch.compile and CUDA graphs (decode batches and the 72-token prompt step replayed)
    "source-marlin-graphs": (
        "source",
        {"moe_backend": "marlin", **_GRAPHS},
        None,
        "stock vLLM, Marlin MoE, compiled + CUDA graphs (the baseline)",
    ),
    "strided-graphs": ("strided", _GRAPHS, "source-marlin-graphs", "within the kernels' bound, compiled + graphs"),
    # the sm121 target's MoE backend (benchmarks/gb10_check.sh: GB10, compute capability 12.1): stock vLLM on it, the
    # sm121 experts through the plugin against that, then the sm121 target against its experts alone. On a GPU below
    # compute capability 10.0 each is an error row (vLLM refuses the backend; the plugin refuses the stored layout)
    "source-flashinfer-cutlass-mxfp8-graphs": (
        "source",
        {"moe_backend": _FLASHINFER_CUTLASS_MXFP8, **_GRAPHS},
        None,
        "stock vLLM, FlashInfer CUTLASS MXFP4 x MXFP8 MoE, compiled + CUDA graphs (the baseline of the sm121 target's "
        "experts; compute capability 10.0 or newer)",
    ),
    "sm121-experts-graphs": (
        "sm121-experts",
        _GRAPHS,
        "source-flashinfer-cutlass-mxfp8-graphs",
        "bit-identical (the stock conversion's expert bytes, dtypes and padding on the same FlashInfer kernel), "
        "compiled + graphs; FlashInfer's start-up autotuning picks each engine's CUTLASS tactics by timing, so a "
        "difference within MXFP8 rounding could be another tactic rather than other bytes",
    ),
    "sm121-graphs": (
        "sm121",
        _GRAPHS,
        "sm121-experts-graphs",
        "the same experts with MXFP4 q/k/v/o/lm_head on vLLM's Marlin linear against BF16: MXFP4 q/k/v/o/lm_head "
        "error alone, compiled + graphs",
    ),
    "strided-wgmma-graphs": (
        "sm90-strided",
        _GRAPHS,
        "strided-graphs",
        "the same weights in the wgmma order, compiled + graphs: within the kernels' bound",
    ),
    "marlin-dense-graphs": ("marlin-dense", _GRAPHS, "marlin-dense", "compiled + graphs against eager"),
    "dense-mxrepack-graphs": (
        "marlin-dense",
        {_ENV: _DENSE_TRITON, **_GRAPHS},
        "marlin-dense-graphs",
        "the same dense bytes on mxrepack's kernels against vLLM's Marlin, both compiled + graphs",
    ),
    # the same dense weights in the wgmma order, on mxrepack's chunk-order dense tiles (whatever the dense kernel)
    "dense-wgmma-graphs": (
        "marlin-dense-wgmma",
        _GRAPHS,
        "marlin-dense-graphs",
        "the same dense values in the wgmma order on mxrepack's dense tiles against vLLM's Marlin, compiled + graphs",
    ),
    # two starts of stock vLLM with Inductor's reduction configs fixed (a fresh start times them again, a start from
    # the compile cache runs the first one's pick: docs/SERVING.md); with --repeat 2 --own-compile-cache, beside
    # source-marlin-graphs
    "source-marlin-graphs-det": (
        "source",
        {"moe_backend": "marlin", _ENV: {"TORCHINDUCTOR_DETERMINISTIC": "1"}, **_GRAPHS},
        "source-marlin-graphs",
        "stock vLLM, Inductor deterministic: a second round equal to the first",
    ),
    # the same for the plugin's dense tiles: with --repeat 2 --own-compile-cache, beside dense-wgmma-graphs
    "dense-wgmma-graphs-det": (
        "marlin-dense-wgmma",
        {_ENV: {"TORCHINDUCTOR_DETERMINISTIC": "1"}, **_GRAPHS},
        "dense-wgmma-graphs",
        "the plugin's dense tiles, Inductor deterministic: a second round equal to the first",
    ),
    # as a user serves a pushed output, by repo id (offline, from a made-up cache of the prebuilt folder: _hub_cache)
    "dense-wgmma-hub": (
        "marlin-dense-wgmma",
        {_HUB: True, **_GRAPHS},
        "dense-wgmma-graphs",
        "served by Hub repo id from an offline cache: loads and generates as by folder; the weights identity the "
        "folder's (vLLM swaps an id for its snapshot's folder offline) or hub:<commit> (online)",
    ),
    # sm_12x's code path on a Hopper: every Triton kernel of the engine built with mma.sync (Triton's DISABLE_MMA_V3),
    # the strided layout's mma2 order beside the rows order and stock Marlin (an mma.sync kernel either way) under it
    "source-marlin-mmav2-graphs": (
        "source",
        {"moe_backend": "marlin", _ENV: _MMA_V2, **_GRAPHS},
        None,
        "stock vLLM, Marlin MoE, graphs, Triton without wgmma (the baseline of sm_12x's code path)",
    ),
    "strided-mmav2-graphs": (
        "strided",
        {_ENV: _MMA_V2, **_GRAPHS},
        "source-marlin-mmav2-graphs",
        "within the kernels' bound, Triton without wgmma",
    ),
    "strided-mma2-graphs": (
        "sm121-strided",
        {_ENV: _MMA_V2, **_GRAPHS},
        "strided-mmav2-graphs",
        "the same experts in the mma2 order and the dense layers MXFP4 in it (sm121-strided), Triton without wgmma: "
        "the kernels' bound plus MXFP4 q/k/v/o/lm_head error",
    ),
    "strided-mma2-bf16-graphs": (
        "strided-mma2",
        {_ENV: _MMA_V2, **_GRAPHS},
        "source-marlin-mmav2-graphs",
        "the mma2 order's experts with BF16 dense (sm121-strided's MoE alone), Triton without wgmma: within the "
        "kernels' bound",
    ),
    "dense-mma2-graphs": (
        "marlin-dense-mma2",
        {_ENV: _MMA_V2, **_GRAPHS},
        "marlin-dense-graphs",
        "the same dense values in the mma2 order on mxrepack's dense tiles (Triton without wgmma, sm_12x's code "
        "path) against vLLM's Marlin, compiled + graphs",
    ),
    # sleep mode: at level 2 (an RL trainer's cycle) the arrival counters (MoE decode combine, dense split-K) come
    # back as model buffers, which vLLM restores on waking, and the weights are reloaded through the plugin's loaders;
    # level 1 and stock vLLM at level 2 beside it
    "sleep-mma2": (
        "sm121-strided",
        {_ENV: _MMA_V2, "enable_sleep_mode": True, _SLEEP: 2},
        None,
        "the same tokens and logprobs after sleep level 2, wake-up and a reload of the weights",
    ),
    "sleep1-mma2": (
        "sm121-strided",
        {_ENV: _MMA_V2, "enable_sleep_mode": True, _SLEEP: 1},
        None,
        "the same tokens and logprobs after sleep level 1 (weights offloaded to the CPU) and wake-up",
    ),
    "sleep-source": (
        "source",
        {"moe_backend": "marlin", "enable_sleep_mode": True, _SLEEP: 2},
        None,
        "stock vLLM: the same tokens and logprobs after sleep level 2, wake-up and a reload of the weights",
    ),
    # the same without programmatic dependent launch (lm_head's GEMV then waits for its activations' preparation in
    # the stream): one suspect of the dense option's one-sequence gap (PERF_LOG stop 30)
    "dense-mxrepack-graphs-nopdl": (
        "marlin-dense",
        {_ENV: {**_DENSE_TRITON, "MXREPACK_PDL": "0"}, **_GRAPHS},
        "dense-mxrepack-graphs",
        "bit-identical to dense-mxrepack-graphs (the same math, launches one after the other)",
    ),
}


def _engine(model: str, out: str, kwargs_json: str) -> None:
    """One case, in this process: start vLLM on ``model``, generate, write the record to ``out``."""
    global _UNPINNED
    _UNPINNED = os.sched_getaffinity(0)
    if os.environ.get(_CPUS_ENV):  # --pin-cpus: before torch sizes its thread pools and vLLM starts its threads
        os.sched_setaffinity(0, cpu_list(os.environ[_CPUS_ENV]))
    sync = _blocking_sync() if os.environ.get(_SYNC_ENV) == "blocking" else None  # before any CUDA context
    import torch

    kwargs = json.loads(kwargs_json)
    record: dict = {"model": model, "kwargs": kwargs, "ok": False}
    if sync is not None:
        record["cuda_sync"] = sync
        if not sync.get("blocking"):  # asked for and not set: a spinning engine's figures would pass for blocking ones
            record["error"] = f"--blocking-sync: the CUDA context's flags were not set ({sync})"
            Path(out).write_text(json.dumps(record))
            return
    record["env"] = kwargs.pop(_ENV, {})
    profile_batches = kwargs.pop(_PROFILE, [])  # sequence counts of the profiled steps (none: no profile)
    batches = kwargs.pop(_BATCHES, [1, 4])
    sleep = kwargs.pop(_SLEEP, 0)  # the sleep level (0: none)
    kwargs.pop(_HUB, None)  # the caller's: the model is already the repo id
    os.environ.pop(DENSE_KERNEL_ENV, None)  # one exported by the caller would make every case's dense the same
    os.environ.update(record["env"])
    record["host"] = _host_state()
    try:
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.model_executor.model_loader import base_loader

        record["vllm"] = vllm.__version__
        phases: dict[str, float] = {}
        load_model = base_loader.BaseModelLoader.load_model

        def timed_load_model(self, *a, **k):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            t = time.perf_counter()
            model_ = load_model(self, *a, **k)
            torch.cuda.synchronize()
            phases["weight_phase_s"] = time.perf_counter() - t
            phases["load_peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
            phases["load_end_gib"] = (torch.cuda.memory_allocated() - base) / 2**30
            return model_

        base_loader.BaseModelLoader.load_model = timed_load_model
        t0 = time.perf_counter()
        engine = {
            "skip_tokenizer_init": True,
            "enforce_eager": True,
            "max_model_len": 256,
            "max_num_seqs": max([4, *batches]),
            "gpu_memory_utilization": 0.35,
            "seed": 0,
            "tensor_parallel_size": 1,
        }
        llm = LLM(model=model, **(engine | kwargs))
        record["ready_s"] = time.perf_counter() - t0
        record.update(phases)
        sp = SamplingParams(
            temperature=0.0, max_tokens=MAX_TOKENS, logprobs=TOP, prompt_logprobs=TOP, detokenize=False, ignore_eos=True
        )
        record["outputs"] = _outputs(llm.generate([{"prompt_token_ids": p} for p in PROMPTS], sp))
        record["weights_identity"] = _weights_identity(llm)
        if sleep:
            llm.sleep(level=sleep)
            llm.wake_up()
            # the arrival counters as the kernels will find them (all zero, or a group's output goes wrong)
            record["counters_nonzero_after_wake"] = llm.collective_rpc(_nonzero_counters)
            if sleep == 2:  # level 2 discarded the weights
                llm.collective_rpc("reload_weights")
            llm.reset_prefix_cache()
            again = _outputs(llm.generate([{"prompt_token_ids": p} for p in PROMPTS], sp))
            record["after_sleep_identical"] = again == record["outputs"]
            if not record["after_sleep_identical"]:
                record["after_sleep_outputs"] = again
        # generation speed: 64 greedy tokens for each batch size (1 and 4 sequences unless --batches; at 2 layers
        # lm_head and the host's step dominate it), their 24-token prompts' prefill included (a prefix-cache hit on
        # the timed runs); the median of 5 runs after one that compiles what the sizes need (one run of ~0.1 s moved by
        # 10% between engines of the same case). Each sequence its own prompt: copies of a few would decode the same
        # tokens and route every copy to the same experts (09f898c's 64 sequences were copies of 3: 12 experts at most)
        for batch in batches:
            timed = SamplingParams(temperature=0.0, max_tokens=64, detokenize=False, ignore_eos=True)
            prompts = [{"prompt_token_ids": _prompt(i)} for i in range(batch)]
            runs, cpu, preempted, waits, cores, spans, steal = [], [], [], [], [], [], []
            with GpuSampler() as gpu:
                for _ in range(1 + DECODE_RUNS):
                    torch.cuda.synchronize()
                    ticks = _cpu_ticks()  # before the clocks: its read is not the run's
                    t, c, u = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
                    wall = time.time()
                    llm.generate(prompts, timed, use_tqdm=False)
                    torch.cuda.synchronize()
                    runs.append(64 * batch / (time.perf_counter() - t))
                    spans.append((wall, time.time()))  # before the reads below: no idle GPU sample in the run
                    ticks_after = _cpu_ticks()
                    cpu.append((time.process_time() - c) / 64 * 1e3)
                    after = resource.getrusage(resource.RUSAGE_SELF)
                    preempted.append((after.ru_nivcsw - u.ru_nivcsw) / 64)
                    waits.append((after.ru_nvcsw - u.ru_nvcsw) / 64)
                    cores.append(_main_thread_core())
                    steal.append(_steal(ticks, ticks_after, cores[-1]["core"]))
            record[f"decode_tok_s_batch{batch}"] = statistics.median(runs[1:])
            record[f"decode_tok_s_batch{batch}_runs"] = runs[1:]
            # where a slow engine's time goes on the host (docs/SERVING.md, stop 48): the process's CPU time a step
            # (all its threads, ms; CUDA's default sync spins, so a wait for the GPU counts too: read it against the
            # step's wall time, 1000 / tok/s at one sequence) and how often a step its threads were preempted (a
            # host shared with other work)
            record[f"decode_cpu_ms_per_step_batch{batch}"] = statistics.median(cpu[1:])
            record[f"decode_cpu_ms_per_step_batch{batch}_runs"] = cpu[1:]
            record[f"decode_preempted_per_step_batch{batch}_runs"] = preempted[1:]
            # and how often a step its threads gave up their CPU (a blocking CUDA sync sleeps at least once a step:
            # --blocking-sync took effect where this is one or more; a spinning one stays near the threads' own waits)
            record[f"decode_voluntary_switches_per_step_batch{batch}_runs"] = waits[1:]
            # one engine's runs moved between two speeds (stop 49): the core the main thread ended each run on and
            # that core's clock then, where the host shows it
            record[f"decode_core_batch{batch}_runs"] = cores[1:]
            # and the GPU's side of the same runs (stop 50: neither the core each run ended on nor the CPU clock the
            # VM reports told the two speeds apart): its SM clock, power and clock-event reasons, as nvidia-smi saw them
            record[f"decode_gpu_batch{batch}_runs"] = [gpu.during(*span) for span in spans[1:]]
            record[f"decode_gpu_sampler_batch{batch}"] = gpu.status
            # stop 51: the GPU held 1980 MHz with no clock-event reason in every run, slow or fast, so what moves is
            # the host: the share of the VM's CPU time the hypervisor took from it (steal) during each run, over all
            # CPUs and on the main thread's core
            record[f"decode_steal_batch{batch}_runs"] = steal[1:]
        for batch in profile_batches:
            record[f"profile_batch{batch}"] = _profile_decode(llm, SamplingParams, batch=int(batch))
        record["ok"] = True
    except BaseException as e:  # noqa: BLE001 - the record says what failed
        record["error"] = f"{type(e).__name__}: {e}"[:2000]
        record["traceback"] = traceback.format_exc()[-8000:]
    Path(out).write_text(json.dumps(record))


def _outputs(outs) -> list[dict]:
    """Each request's generated tokens, their top logprobs and its prompt's, as a record keeps them."""
    return [
        {
            "tokens": list(o.outputs[0].token_ids),
            "logprobs": [{str(t): lp.logprob for t, lp in d.items()} for d in (o.outputs[0].logprobs or [])],
            "prompt_logprobs": [
                {str(t): lp.logprob for t, lp in d.items()} if d else {} for d in (o.prompt_logprobs or [])
            ],
        }
        for o in outs
    ]


def _nonzero_counters(worker) -> int:
    """On a worker: how many of mxrepack's arrival counters are not zero (every buffer, the outgrown ones too)."""
    from mxrepack.kernels import arrival

    return int(sum(int((buf != 0).sum()) for buf in [*arrival._COUNTERS.values(), *arrival._OUTGROWN]))


def _weights_identity(llm) -> str | None:
    """The weights' identity the plugin recorded in the engine's quantization config (where vLLM hashes its compile
    cache; ``mxrepack.serve.spec.weights_identity``), or None."""
    try:
        qc = llm.llm_engine.vllm_config.model_config.hf_config.quantization_config
        return qc.get("mxrepack_weights") if isinstance(qc, dict) else getattr(qc, "mxrepack_weights", None)
    except AttributeError:
        return None


# kernels of a MoE layer, stock vLLM's (Marlin and its routing, triton_kernels) and mxrepack's (moe_mxfp4), by name
_MOE_KERNELS = (
    "marlin_moe",
    "moe_align",
    "topkgating",
    "swiglu",
    "moe_sum",
    "matmul_ogs",
    "_gate_up",
    "_down",
    "_schedule",
    "_combine",
    "_prepare_x",
    "routing",
    "bitmatrix",
    "reduce_grouped",
)


def _union_us(spans: list[tuple[float, float]]) -> float:
    """The length of the union of intervals ``spans``."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


_TIMELINE_KERNELS = 80


def _timeline(kernels: list[tuple[float, float, str]]) -> list[tuple[str, float, float]]:
    """(start, end, name) in us, sorted -> (name, start, end) relative to the first one's start, to 0.1 us."""
    t0 = kernels[0][0] if kernels else 0.0
    return [(name, round(a - t0, 1), round(b - t0, 1)) for a, b, name in kernels]


def _profile_decode(llm, SamplingParams, tokens: int = 16, batch: int = 1) -> dict:
    """Where ``batch`` sequences' decode steps spend their time (each its own prompt, as the timed runs): ``tokens``
    greedy tokens under torch.profiler (after the timed runs, so nothing compiles), their prompts' prefill (a
    prefix-cache hit) included: the steps' wall time, the GPU kernels' summed time, graph launches against single
    kernel launches made by the host, and the host ops and kernels that took the most."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    sp = SamplingParams(temperature=0.0, max_tokens=tokens, detokenize=False, ignore_eos=True)
    prompt = [{"prompt_token_ids": _prompt(i)} for i in range(batch)]
    marked = llm.collective_rpc(_mark_lm_head)  # lm_head's call, eager at every step, a range of its own
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        t = time.perf_counter()
        llm.generate(prompt, sp, use_tqdm=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    tally = _tally(prof.events(), torch.autograd.DeviceType.CUDA)
    return {
        "steps": tokens,
        "batch": batch,
        "ms_per_step_profiled": wall / tokens * 1e3,
        "gpu_kernel_ms_per_step": sum(tally.kernel_us.values()) / tokens / 1e3,
        # the time some kernel ran (a union: kernels launched under PDL overlap the one before, and a sum counts that
        # twice), and the same over the MoE layers' kernels (routing to combine, either backend)
        "gpu_busy_ms_per_step": _union_us(tally.spans) / tokens / 1e3,
        "moe_busy_ms_per_step": _union_us(tally.moe_spans) / tokens / 1e3,
        "runtime_calls": tally.runtime.most_common(12),
        "kernel_us": tally.kernel_us.most_common(20),
        # each of those kernels' calls and median duration: the decode steps' typical call, where the total above
        # also holds the prompt's step
        "kernel_median_us": [
            (name, len(tally.durations[name]), sorted(tally.durations[name])[len(tally.durations[name]) // 2])
            for name, _ in tally.kernel_us.most_common(20)
        ],
        # the last decode step's end as a timeline: (name, start and end in us after the first listed kernel's
        # start), enough kernels for a few layers; a kernel launched under PDL starts before the one before it ends
        "last_kernels": _timeline(sorted(tally.kernels)[-_TIMELINE_KERNELS:]),
        "host_self_us": tally.host_us.most_common(20),
        # the host time of mxrepack's own ops (the registered dense op, the MoE method's calls) a step. Since stop 45
        # an eager dense call (lm_head's, every step) calls the op's function without the dispatcher: not counted here
        "host_mxrepack_us_per_step": sum(v for k, v in tally.host_us.items() if "mxrepack" in k) / tokens,
        # lm_head's call on the host, whoever serves it (Marlin's apply or the plugin's direct launch): the engine's
        # answer to "what does our lm_head cost the host against Marlin's", which the op count above no longer sees
        "lm_head_marked": marked,
        "lm_head_calls": len(tally.lm_head_calls),
        "lm_head_host_us_median": statistics.median(tally.lm_head_calls) if tally.lm_head_calls else None,
        "lm_head_host_us_per_step": sum(tally.lm_head_calls) / tokens,
        "lm_head_gpu_us_median": statistics.median(tally.lm_head_gpu) if tally.lm_head_gpu else None,
    }


# no "mxrepack" in it: host_mxrepack_us_per_step counts the host ops whose name holds that (85a77a1's range did)
_LM_HEAD_RANGE = "check::lm_head"


class _Tally:
    """A profile's events sorted out (:func:`_tally`); times in us. (A plain class: the tests load this script by
    path, where a dataclass cannot resolve its module.)"""

    def __init__(self):
        self.runtime = collections.Counter()  # CUDA API calls, by name
        self.kernel_us = collections.Counter()  # GPU time, by kernel
        self.host_us = collections.Counter()  # host self time, by op
        self.durations = collections.defaultdict(list)  # kernel -> each call's duration
        self.spans, self.moe_spans = [], []  # the kernels' and the MoE layers' kernels' (start, end)
        self.kernels = []  # (start, end, name)
        self.lm_head_calls = []  # each lm_head call's host time (its apply, inclusive)
        self.lm_head_gpu = []  # each lm_head range's GPU-side span


def _tally(events, cuda) -> _Tally:
    """torch.profiler's ``events`` (``cuda``: the CUDA device type) sorted into kernels, CUDA API calls, host ops and
    the lm_head range (:data:`_LM_HEAD_RANGE`), whose GPU-side span is no kernel and is kept out of the kernels'."""
    t = _Tally()
    for e in events:
        if e.name == _LM_HEAD_RANGE:
            if e.device_type == cuda:
                t.lm_head_gpu.append(e.time_range.end - e.time_range.start)
            else:
                t.lm_head_calls.append(e.cpu_time_total)
        elif e.device_type == cuda:
            t.kernel_us[e.name[:80]] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            t.spans.append((e.time_range.start, e.time_range.end))
            t.durations[e.name[:80]].append(e.time_range.end - e.time_range.start)
            t.kernels.append((e.time_range.start, e.time_range.end, e.name[:48]))
            if any(m in e.name.lower() for m in _MOE_KERNELS):
                t.moe_spans.append(t.spans[-1])
        elif e.name.startswith(("cuda", "cu")):
            t.runtime[e.name] += 1
        else:
            t.host_us[e.name[:80]] += e.self_cpu_time_total
    return t


def _mark_lm_head(worker) -> str:
    """On a worker: wrap the lm_head's quant method ``apply`` in a profiler range (:data:`_LM_HEAD_RANGE`), once; the
    method's class name, for the record."""
    from torch.profiler import record_function

    method = worker.model_runner.get_model().lm_head.quant_method
    if not getattr(method, "_mxrepack_check_marked", False):
        apply = method.apply

        def marked(*args, **kwargs):
            with record_function(_LM_HEAD_RANGE):
                return apply(*args, **kwargs)

        method.apply = marked
        method._mxrepack_check_marked = True
    return type(method).__name__


def stock_case(name: str) -> str | None:
    """The stock-vLLM Marlin case run in the same mode as case ``name`` (the same LLM arguments and environment but
    the MoE backend): what the check also compares ``name`` with when both ran, beside its own baseline. None for a
    stock case, or where no stock case matches."""
    what, kwargs, _, _ = CASES[name]
    if what == "source":
        return None
    mode = {k: v for k, v in kwargs.items() if k != "moe_backend"}
    return next(
        (
            n
            for n, (w, kw, _, _) in CASES.items()
            if w == "source"
            and kw.get("moe_backend") == "marlin"
            and {k: v for k, v in kw.items() if k != "moe_backend"} == mode
        ),
        None,
    )


def compare(a: dict, b: dict) -> dict:
    """Greedy tokens equal? |logprob differences| over the tokens both list, at every prompt position and at each
    generated position up to the first token that differs (after it the two condition on different text)."""
    if not (a.get("ok") and b.get("ok")):
        return {"comparable": False}
    same_tokens, diffs = True, []
    for oa, ob in zip(a["outputs"], b["outputs"]):
        same_tokens &= oa["tokens"] == ob["tokens"]
        generated = 0
        while (
            generated < min(len(oa["tokens"]), len(ob["tokens"])) and oa["tokens"][generated] == ob["tokens"][generated]
        ):
            generated += 1
        pairs = list(zip(oa["prompt_logprobs"], ob["prompt_logprobs"]))
        pairs += list(zip(oa["logprobs"], ob["logprobs"]))[: generated + 1]
        for da, db in pairs:
            diffs += [abs(da[t] - db[t]) for t in set(da) & set(db)]
    diffs.sort()
    pick = (lambda q: diffs[min(len(diffs) - 1, int(q * len(diffs)))]) if diffs else (lambda q: None)
    return {
        "comparable": True,
        "tokens_equal": same_tokens,
        "max_abs_logprob_diff": diffs[-1] if diffs else None,
        "median_abs_logprob_diff": pick(0.5),
        "p99_abs_logprob_diff": pick(0.99),
        "logprobs_compared": len(diffs),
        "bit_identical": same_tokens and bool(diffs) and diffs[-1] == 0.0,
    }


def _convert(work: str, out: str) -> None:
    """The tensors the plugin hands to vLLM's kernels vs vLLM's own conversion of the source, layer 0."""
    import torch
    from common import vllm_convert
    from safetensors import safe_open
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle

    from mxrepack.gptoss import EXPERT_PARTS
    from mxrepack.serve.spec import ServeSpec, load_config

    work_dir = Path(work)
    src = work_dir / "src"
    results = {}

    def tensors(directory: Path, names: list[str]) -> dict:
        index = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
        got = {}
        for n in names:
            with safe_open(directory / index[n], "pt", device="cuda") as f:
                got[n] = f.get_tensor(n)
        return got

    s = tensors(src, [f"model.layers.0.mlp.experts.{p}" for p in EXPERT_PARTS])
    s = {p: s[f"model.layers.0.mlp.experts.{p}"] for p in EXPERT_PARTS}
    for target, backend_name in (
        ("sm80", "MARLIN"),
        ("sm90", "TRITON"),
        ("sm100", "FLASHINFER_TRTLLM_MXFP4_BF16"),
        ("sm121", "FLASHINFER_CUTLASS_MXFP4_MXFP8"),
    ):
        rec: dict = {"backend": backend_name}
        results[target] = rec
        try:
            tdir = work_dir / target
            spec = ServeSpec.from_config(load_config(tdir))
            (_h, hp), (_i, ip) = spec.hidden, spec.intermediate
            E = s["gate_up_proj_blocks"].shape[0]

            def padded(x, rows, cols=None):
                out = torch.zeros((E, rows) + ((cols,) if cols is not None else ()), dtype=x.dtype, device=x.device)
                if cols is None:
                    out[:, : x.shape[1]] = x
                else:
                    out[:, : x.shape[1], : x.shape[2]] = x
                return out

            # vLLM's parameters after its own load (zeros, the checkpoint in the top-left corner), at the stored padding
            w13 = padded(s["gate_up_proj_blocks"].flatten(2), 2 * ip, hp // 2)
            w13s = padded(s["gate_up_proj_scales"], 2 * ip, hp // 32)
            b13 = padded(s["gate_up_proj_bias"], 2 * ip)
            w2 = padded(s["down_proj_blocks"].flatten(2), hp, ip // 2)
            w2s = padded(s["down_proj_scales"], hp, ip // 32)
            b2 = padded(s["down_proj_bias"], hp)
            backend = oracle.Mxfp4MoeBackend[backend_name]
            got = vllm_convert(
                backend_name,
                {
                    "w13_weight": w13,
                    "w2_weight": w2,
                    "w13_weight_scale": w13s,
                    "w2_weight_scale": w2s,
                    "w13_bias": b13,
                    "w2_bias": b2,
                },
            )
            names = ["w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_bias", "w2_bias"]
            vllm_t = dict(zip(names, got))
            if backend in oracle.TRITON_BACKENDS:  # wrappers: compare their storage bytes in memory order
                vllm_t["w13_weight"] = vllm_t["w13_weight"].storage.data.mT
                vllm_t["w2_weight"] = vllm_t["w2_weight"].storage.data.mT
                for w in ("w13", "w2"):
                    pc = vllm_t[f"{w}_weight_scale"]
                    sc = getattr(pc, "weight_scale", None) or getattr(pc, "b_mx_scale")
                    vllm_t[f"{w}_weight_scale"] = sc.storage.data.mT
            ours = tensors(tdir, [f"model.layers.0.mlp.experts.{n}" for n in names])
            for n in names:
                a, b = ours[f"model.layers.0.mlp.experts.{n}"], vllm_t[n]
                if backend in oracle.TRTLLM_BACKENDS and n.endswith("_bias"):
                    a = a.float()  # the plugin's retype
                ab = a.contiguous().view(torch.uint8).reshape(-1)
                bb = b.contiguous().view(torch.uint8).reshape(-1)
                rec[n] = {
                    "ours": [str(a.dtype), list(a.shape)],
                    "vllm": [str(b.dtype), list(b.shape)],
                    "bytes_equal": bool(ab.numel() == bb.numel() and torch.equal(ab, bb)),
                }
            rec["all_equal"] = all(v["bytes_equal"] for k, v in rec.items() if isinstance(v, dict))
        except BaseException as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {e}"[:2000]
            rec["traceback"] = traceback.format_exc()[-3000:]
        print(f"== convert {target} ({backend_name}): {rec.get('all_equal', rec.get('error'))}", flush=True)
    Path(out).write_text(json.dumps(results))


def _hub_cache(folder: Path, work: Path) -> dict:
    """``folder`` as the snapshot of a made-up Hub repo in an offline Hugging Face cache under ``work``: its files
    linked into ``models--mxrepack-check--<name>/snapshots/<commit>`` and ``refs/main`` naming that commit (made from
    the folder's weights identity, so a folder written again gets another; links made again each call). Returns the
    repo id, the commit and the two weights identities the engine may record: the folder's, where vLLM swaps an
    offline repo id for its snapshot's folder (0.26), and the snapshot's commit, where it keeps the id."""
    import hashlib

    from mxrepack.serve.spec import weights_identity

    identity = weights_identity(folder)
    commit = hashlib.sha1(identity.encode()).hexdigest()
    repo = f"mxrepack-check/{folder.name}"
    repo_dir = work / "hf-hub" / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for link in snapshot.iterdir():  # links of an earlier call, some perhaps to files gone since
        link.unlink()
    for f in folder.iterdir():
        if f.is_file():
            (snapshot / f.name).symlink_to(f.resolve())
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)
    return {"repo": repo, "commit": commit, "folder_identity": identity}


def _engine_env(name: str, work: Path, own_cache: bool, cpus: str | None = None, blocking_sync: bool = False) -> dict:
    """The environment of case ``name``'s engine process: vLLM's engine in that process; for a Hub case the work
    folder's made-up Hugging Face cache, offline; with ``own_cache``, a vLLM compile cache of the case's own under the
    work folder (what a second round of the case finds); with ``cpus`` (a CPU list), the CPUs it runs on; with
    ``blocking_sync``, CUDA's blocking synchronization (:func:`_blocking_sync`)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if cpus:
        env[_CPUS_ENV] = cpus
    if blocking_sync:
        env[_SYNC_ENV] = "blocking"
    if CASES[name][1].get(_HUB):
        env |= {"HF_HUB_CACHE": str(work / "hf-hub"), "HF_HUB_OFFLINE": "1"}
    if own_cache:
        env["VLLM_CACHE_ROOT"] = str(work / "vllm-cache" / name)
    return env


_CPUS_ENV = "MXREPACK_CHECK_CPUS"  # the engine process's CPU list, from --pin-cpus
_SYNC_ENV = "MXREPACK_CHECK_CUDA_SYNC"  # "blocking": the engine's CUDA context blocks in a sync, from --blocking-sync
_CU_CTX_SCHED_BLOCKING_SYNC, _CU_CTX_SCHED_MASK = 0x04, 0x07  # cuda.h's CUctx_flags


def _blocking_sync(libcuda: str = "libcuda.so.1") -> dict:
    """Sets the primary CUDA context of device 0 (of those visible) to block the calling thread in a synchronization
    instead of spinning (``cuDevicePrimaryCtxSetFlags``, the driver's: the runtime torch uses takes the primary
    context as the driver left it), before this process creates it. With CUDA's default (spin, on a machine with more
    CPUs than GPUs) a step's CPU time counts its waits for the GPU too: blocking, it counts the host's work only
    (stops 49-51: which of the two the slow engines spend longer on). Returns what the driver said (``set``, 0 on
    success), the context's flags read back, and ``blocking``: whether they now say so; ``error`` where there is no
    driver or a call failed. Each run's voluntary context switches (``decode_voluntary_switches_per_step_batch<N>``)
    show whether the engine's waits then blocked."""
    import ctypes

    try:
        cuda = ctypes.CDLL(libcuda)
        dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        rc = {"init": cuda.cuInit(0)}
        rc["device"] = rc["init"] or cuda.cuDeviceGet(ctypes.byref(dev), 0)
        rc["get"] = rc["device"] or cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))
        if rc["get"]:
            return {"error": f"the CUDA driver's calls returned {rc}", "blocking": False}
        set_flags = getattr(cuda, "cuDevicePrimaryCtxSetFlags_v2", None) or cuda.cuDevicePrimaryCtxSetFlags
        # the scheduling field replaced, the other flags kept (none by default)
        wanted = (flags.value & ~_CU_CTX_SCHED_MASK) | _CU_CTX_SCHED_BLOCKING_SYNC
        rc["set"] = set_flags(dev, ctypes.c_uint(wanted))
        rc["get_after"] = cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))
    except (OSError, AttributeError) as e:  # no driver, or one without these calls
        return {"error": f"{type(e).__name__}: {e}"[:200], "blocking": False}
    blocking = not rc["set"] and not rc["get_after"] and flags.value & _CU_CTX_SCHED_MASK == _CU_CTX_SCHED_BLOCKING_SYNC
    return {"set": int(rc["set"]), "flags": flags.value, "active": bool(active.value), "blocking": blocking}


def cpu_list(text: str) -> set[int]:
    """A Linux CPU list ("0-7,16-23", as ``local_cpulist`` and ``taskset -c`` write it) as CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def cpu_text(cpus: set[int]) -> str:
    """CPU numbers as a Linux CPU list, runs joined ("0-7,16-23"): :func:`cpu_list`'s inverse."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def pci_cpulist_path(bus_id: str) -> Path:
    """sysfs' ``local_cpulist`` of the PCI device nvidia-smi names ``bus_id`` ("00000000:18:00.0": an 8-digit
    domain, where sysfs writes 4, in lower case)."""
    domain, rest = bus_id.strip().split(":", 1)
    return Path("/sys/bus/pci/devices") / f"{int(domain, 16):04x}:{rest.lower()}" / "local_cpulist"


def _gpu_local_cpus() -> set[int]:
    """The CPUs of the engines' GPU's own NUMA node (the first visible one), from its PCI device's ``local_cpulist``:
    an engine on them reaches the GPU and its pinned memory without crossing sockets."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    bus = subprocess.run(
        ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", visible or "0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return cpu_list(pci_cpulist_path(bus).read_text())


def pinned_cpus(wanted: set[int], allowed: set[int]) -> str:
    """The CPU list engines are pinned to: ``wanted`` within what this process may run on (a container's cpuset can
    hold fewer CPUs than a NUMA node lists). Raises when nothing is left."""
    cpus = wanted & allowed
    if not cpus:
        raise SystemExit(f"--pin-cpus: none of CPUs {cpu_text(wanted)} is allowed here ({cpu_text(allowed)})")
    return cpu_text(cpus)


class GpuSampler:
    """``nvidia-smi`` sampling the engines' GPU every ``period_ms`` while the decode runs go, in a process of its own
    (so no Python thread in the engine's process; placed off the CPUs ``--pin-cpus`` gave the engine where the machine
    has others, else sharing them): each sample's time, SM and memory clocks (MHz), power (W, the instantaneous
    reading: ``power.draw`` is a trailing 1 s average on Ampere and later) and active clock-event reasons (a bitmask:
    0x1 idle, 0x4 software power cap, 0x8 hardware slowdown, 0x20 / 0x40 thermal, ...; the field's older name, which
    driver 580 still takes). :meth:`during` gives one run's; :attr:`status` says how the sampling went (exit status,
    samples, the first line that did not parse, nvidia-smi's CPU time), so a run without samples says why.

    nvidia-smi prints local time: it runs under ``TZ=UTC`` and is read as UTC, so no zone or DST shift moves a sample
    out of its run. It runs under coreutils' ``timeout``, so an engine killed inside the block (its case's time limit,
    a crash) leaves no sampler behind for longer than ``limit_s``."""

    FIELDS = "timestamp,clocks.sm,clocks.mem,power.draw.instant,clocks_throttle_reasons.active"

    def __init__(self, period_ms: int = 20, command: str = "nvidia-smi", limit_s: int = 900):
        self.period_ms, self.command, self.limit_s = period_ms, command, limit_s
        self.samples: list[tuple] = []
        self.status: dict = {"started": False, "samples": 0}
        self._proc = None

    def __enter__(self) -> GpuSampler:
        import tempfile

        self._out = tempfile.TemporaryFile(mode="w+")
        self._cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        args = [self.command, f"--query-gpu={self.FIELDS}", "--format=csv,noheader,nounits", "-i", _gpu_id()]
        try:
            self._proc = subprocess.Popen(
                ["timeout", str(self.limit_s), *args, f"--loop-ms={self.period_ms}"],
                stdout=self._out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "TZ": "UTC"},
            )
        except OSError as e:
            self.status["error"] = f"{type(e).__name__}: {e}"
            return self
        self.status["started"] = True
        others = (_UNPINNED or set()) - os.sched_getaffinity(0)
        if others:  # the engine is pinned and the machine has other CPUs: the sampler takes those
            try:
                os.sched_setaffinity(self._proc.pid, others)
            except OSError:
                pass
        deadline = time.monotonic() + 10  # its first sample before the first run (NVML's start takes a while)
        while self._proc.poll() is None and os.fstat(self._out.fileno()).st_size == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._proc is not None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(timeout=10)
                self._out.seek(0)
                lines = [(line, _gpu_sample(line)) for line in self._out.read().splitlines()]
                self.samples = [sample for _, sample in lines if sample is not None]
                cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
                unparsed = [line for line, sample in lines if sample is None and line.strip()]
                self.status |= {
                    "returncode": self._proc.returncode,
                    "samples": len(self.samples),
                    "first_unparsed": unparsed[0][:200] if unparsed else None,
                    "cpu_s": round(cpu.ru_utime + cpu.ru_stime - self._cpu0.ru_utime - self._cpu0.ru_stime, 3),
                }
        except Exception as e:  # noqa: BLE001 - a diagnostic: never the engine's record
            self.status["error"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            self._out.close()

    def during(self, t0: float, t1: float) -> dict | None:
        """The samples from ``t0`` to ``t1`` (``time.time()``): the SM clock's lowest / median / highest, the memory
        clock's and power's medians, every reason bitmask seen (hex), and how many samples; a field nvidia-smi could not
        read ("[N/A]") is left out of its figure (None where no sample had it). None where no sample fell in the run
        (:attr:`status` says why: no nvidia-smi, an error, or a run shorter than the period)."""
        inside = [x for x in self.samples if t0 <= x[0] <= t1]
        if not inside:
            return None

        def values(i: int) -> list:
            return [x[i] for x in inside if x[i] is not None]

        sm, mem, power, reasons = values(1), values(2), values(3), values(4)
        return {
            "sm_mhz": [min(sm), statistics.median(sm), max(sm)] if sm else None,
            "mem_mhz": statistics.median(mem) if mem else None,
            "power_w": statistics.median(power) if power else None,
            "reasons": sorted({hex(r) for r in reasons}),
            "samples": len(inside),
        }


def gpu_samples(text: str) -> list[tuple]:
    """``GpuSampler``'s nvidia-smi lines -> their samples (:func:`_gpu_sample`), the lines that are none dropped."""
    return [sample for line in text.splitlines() if (sample := _gpu_sample(line)) is not None]


def _gpu_sample(line: str) -> tuple | None:
    """One nvidia-smi line ("2026/11/29 14:05:01.123, 1980, 3201, 412.35, 0x0000000000000000", UTC) -> (epoch seconds,
    SM MHz, memory MHz, W, reasons); a field that does not parse ("[N/A]", "[Not Supported]") is None; None for a line
    whose time does not parse (an error message)."""
    from datetime import datetime, timezone

    def number(text: str, parse) -> float | int | None:
        try:
            return parse(text)
        except ValueError:
            return None

    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 5:
        return None
    try:
        when = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None
    return (when, *(number(p, float) for p in parts[1:4]), number(parts[4], lambda t: int(t, 16)))


def _gpu_id() -> str:
    """What ``nvidia-smi -i`` takes for this process's first CUDA device: its UUID where torch gives one (CUDA's and
    nvidia-smi's device orders can differ), else the first of ``CUDA_VISIBLE_DEVICES`` (an index or a UUID), else 0."""
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(0).uuid)
        if uuid:
            return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    except Exception:  # noqa: BLE001 - no torch, no CUDA: the environment's choice
        pass
    return os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip() or "0"


_UNPINNED: set[int] | None = None  # the engine process's CPUs before --pin-cpus narrowed them (GpuSampler's)


def _cpu_ticks(stat: str | None = None) -> dict[str, tuple[int, int]]:
    """Each ``cpu`` line of ``/proc/stat`` (or of ``stat``, its text): the aggregate "cpu" and "cpu<N>", their steal
    ticks (the time a hypervisor ran something else while this VM's CPU was ready to run) and all their ticks; empty
    where the host shows none. The share is read per run, in ticks of 10 ms, on the core the main thread ended on."""
    if stat is None:
        try:
            stat = Path("/proc/stat").read_text()
        except OSError:
            return {}
    ticks = {}
    for line in stat.splitlines():
        name, *values = line.split() or [""]
        if name.startswith("cpu") and len(values) >= 8:
            counts = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal (guest: in user)
            ticks[name] = (counts[7], sum(counts))
    return ticks


def _steal(before: dict, after: dict, core: int) -> dict:
    """The share of CPU time stolen between two :func:`_cpu_ticks` reads, over all CPUs and on ``core``; None where
    either read lacks the line or no tick passed."""

    def share(name: str) -> float | None:
        if name not in before or name not in after:
            return None
        total = after[name][1] - before[name][1]
        return (after[name][0] - before[name][0]) / total if total > 0 else None

    return {"all": share("cpu"), "core": share(f"cpu{core}")}


def _main_thread_core() -> dict:
    """The CPU the calling thread last ran on (``/proc/thread-self/stat``'s field 39) and that CPU's clock in MHz
    (cpufreq's ``scaling_cur_freq``, else ``/proc/cpuinfo``; None where the host shows neither, as some VMs do)."""
    core = int(Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()[36])
    mhz = None
    try:
        mhz = int(Path(f"/sys/devices/system/cpu/cpu{core}/cpufreq/scaling_cur_freq").read_text()) / 1000
    except (OSError, ValueError):
        for block in Path("/proc/cpuinfo").read_text().split("\n\n"):
            fields = {
                k.strip(): v.strip() for k, v in (line.split(":", 1) for line in block.splitlines() if ":" in line)
            }
            if fields.get("processor") == str(core) and "cpu MHz" in fields:
                mhz = float(fields["cpu MHz"])
    return {"core": core, "mhz": mhz}


def _host_state() -> dict:
    """What an engine's host had when it started: its CPUs (the affinity) and the machine's load."""
    cpus = os.sched_getaffinity(0)
    return {"cpus": len(cpus), "affinity": cpu_text(cpus), "loadavg": Path("/proc/loadavg").read_text().split()[:3]}


# seconds an engine process (or the conversion check) may run before it is killed (--engine-timeout)
ENGINE_TIMEOUT_S = 900


def _subprocess(args: list[str], log: Path, env: dict | None = None, timeout: int | None = None) -> str | None:
    """This script's ``args`` in a process of its own, its output written to ``log`` as it comes. Returns None, or why
    it left no record: killed at ``timeout`` seconds (``ENGINE_TIMEOUT_S`` unless given), so that one engine that hangs
    or compiles for too long (a first FlashInfer JIT build) is that case's error row, not the end of the run."""
    timeout = timeout or ENGINE_TIMEOUT_S
    # a session of its own, so that a kill reaches the engine's own children too (Inductor's compile workers, a
    # FlashInfer JIT build): left running they would hold the GPU's memory for the next case. Its output goes to the
    # log file itself, not through pipes this process reads: a child left holding a pipe cannot keep a case waiting,
    # and the log is there whatever becomes of this process
    with open(log, "w") as out:
        p = subprocess.Popen(
            [sys.executable, __file__, *args],
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_session(p)
            out.write(f"\n== killed after {timeout} s (--engine-timeout)\n")
            return f"no record (killed after {timeout} s: --engine-timeout)"
        except BaseException:  # a Ctrl-C or hang-up reaches this script only (the engine is in its own session)
            _kill_session(p)
            raise
        _kill_session(p)  # whatever of the engine's session outlived it
    return None


def _kill_session(p: subprocess.Popen) -> None:
    """SIGKILL to every process of ``p``'s session (``p`` leads it: ``start_new_session``), then ``p`` reaped; not
    waiting for the others, one stuck in the driver could not be waited for."""
    import signal

    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:  # the whole session already gone
        pass
    p.wait()


def _bf16_dense_twin(quantized: Path, twin: Path) -> None:
    """``quantized`` with every dense MXFP4 weight dequantized to a BF16 ``weight`` (the same values), so that stock
    vLLM's BF16 linear computes what the plugin's Marlin MXFP4 linear should."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from mxrepack.quant.mx import dequantize_mxfp4

    config = json.loads((quantized / "config.json").read_text())
    qc = config["quantization_config"]
    modules = qc["groups"].pop("dense")["modules"]
    qc["layouts"] = [name for name in qc["layouts"] if not name.startswith("dense")]
    tensors: dict = {}
    for f in sorted(quantized.glob("*.safetensors")):
        tensors.update(load_file(f))
    for m in modules:
        tensors[f"{m}.weight"] = dequantize_mxfp4(
            tensors.pop(f"{m}.weight_packed"), tensors.pop(f"{m}.weight_scale"), torch.bfloat16
        )
    tmp = twin.with_name(twin.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for side in quantized.glob("*.json"):
        if side.name not in ("config.json", "model.safetensors.index.json", "mxrepack.json"):
            shutil.copyfile(side, tmp / side.name)
    tmp.rename(twin)


def _model(name: str, work: Path, src: Path, ct_site: str | None = None) -> Path:
    if name == "source":
        return src
    from mxrepack.repack.pipeline import repack

    model = work / name
    if name == "marlin-dense-twin" and not model.exists():
        _bf16_dense_twin(_model("marlin-dense", work, src), model)
    recipe = None
    if name in RECIPES:
        import yaml

        recipe = work / f"{name}.yaml"
        recipe.write_text(yaml.safe_dump(RECIPES[name]))
    if name in ("compressed-tensors", "ct-experts") and ct_site and not model.exists():
        # vLLM pins compressed-tensors 0.17; the target is written with a tested one, in a process of its own
        code = (
            "from mxrepack.repack.pipeline import repack; "
            f"repack({str(src)!r}, {None if recipe else name!r}, {str(model)!r}, "
            f"recipe_file={str(recipe) if recipe else None!r}, hash_source=False)"
        )
        p = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONPATH": f"{ct_site}:" + os.environ.get("PYTHONPATH", "")},
            capture_output=True,
            text=True,
        )
        if p.returncode:
            raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}")
    if not model.exists():
        t = time.perf_counter()
        repack(
            str(src), None if recipe else name, model, recipe_file=str(recipe) if recipe else None, hash_source=False
        )
        print(f"repack {name}: {time.perf_counter() - t:.1f} s", flush=True)
    return model


def _hang_up_as_interrupt() -> None:
    """SIGHUP (a dropped SSH session) and SIGTERM end this script as a Ctrl-C does, through ``_subprocess``'s clean-up:
    their default action would kill it at once, leaving the engine of the case under way (in a session of its own)
    holding the GPU."""
    import signal

    def interrupt(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, interrupt)


def main() -> None:
    global ENGINE_TIMEOUT_S  # --engine-timeout, read by _subprocess
    if len(sys.argv) > 1 and sys.argv[1] == "_engine":
        _engine(*sys.argv[2:5])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_convert":
        _convert(*sys.argv[2:4])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/root/vpc")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--convert", action="store_true", help="also compare the plugin's tensors with vLLM's conversion")
    ap.add_argument("--ct-site", help="a folder holding compressed-tensors 0.19-0.21, for writing that target")
    ap.add_argument("--commit", help="the commit under test, for the record (the device's copy has no history)")
    ap.add_argument(
        "--prebuild",
        action="store_true",
        help="only write the fixture and every case's checkpoint (CPU work, no vLLM): lets the vllm-kit "
        "dance's first device calls, which only carry kit parts, do it",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the case list this many times, interleaved (one engine per case and round); each case's record "
        "keeps every round's load times and decode speeds and their medians, logprobs are compared with the baseline "
        "in the first round and each later round's with the first's",
    )
    ap.add_argument(
        "--own-compile-cache",
        action="store_true",
        help="each case with a vLLM compile cache of its own under --work, emptied before its first round: the first "
        "round compiles afresh and a later one starts from its cache (two starts compared, with --repeat 2)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="each engine also profiles 16 decode steps of one sequence (torch.profiler): host against GPU time",
    )
    ap.add_argument(
        "--profile-batch",
        default="1",
        help="--profile: comma-separated sequence counts decoding together in the profiled steps (each its own "
        "prompt), one profile each",
    )
    ap.add_argument(
        "--batches",
        default="1,4",
        help="sequence counts whose decode speed is timed (engines take max_num_seqs to match); past a few layers and "
        "tens of sequences the kernels, not the host's step, set it",
    )
    ap.add_argument(
        "--pin-cpus",
        help="run every engine on these CPUs (a list such as 0-15, or 'gpu': the GPU's own NUMA node's, from "
        "sysfs), within those this process may use: unpinned, one case's engines decoded one sequence at 383-667 "
        "tok/s (docs/SERVING.md, stop 48); on an H200 whose GPU's node held all its CPUs, 'gpu' changed nothing "
        "(stop 49)",
    )
    ap.add_argument(
        "--blocking-sync",
        action="store_true",
        help="every engine's CUDA context blocks in a synchronization instead of spinning, so that a decode step's "
        "CPU time (decode_cpu_ms_per_step_batch<N>) counts the host's work only (with the default spin it also "
        "counts the waits: stops 49-51)",
    )
    ap.add_argument(
        "--engine-timeout",
        type=int,
        default=ENGINE_TIMEOUT_S,
        help="seconds each engine process (and --convert's) may run before it is killed and its case recorded as an "
        "error; longer for a machine whose first engine compiles FlashInfer's kernels",
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    ENGINE_TIMEOUT_S = args.engine_timeout
    _hang_up_as_interrupt()
    # every name checked before anything is built: a typo is one line, not a KeyError after an hour of engines; an
    # empty list runs no case (with --convert: the conversions alone)
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}: see CASES in {Path(__file__).name}")
    from mxrepack.repack.fixture import make_fixture

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src"
    if not src.exists():
        t = time.perf_counter()
        make_fixture(src, preset="20b", layers=args.layers, num_local_experts=args.experts)
        print(f"fixture: {time.perf_counter() - t:.1f} s", flush=True)
    if args.prebuild:
        checkpoints = [CASES[c][0] for c in names] + (["sm80", "sm90", "sm100", "sm121"] if args.convert else [])
        for name in dict.fromkeys(checkpoints):
            if name != "source":
                try:
                    _model(name, work, src, args.ct_site)
                except Exception as e:  # noqa: BLE001 - the check run reports it again
                    print(f"{name}: {e}", flush=True)
        return
    results: dict = {
        "date": date.today().isoformat(),
        "commit": args.commit,
        "layers": args.layers,
        "experts": args.experts,
        "blocking_sync": args.blocking_sync,
        "cases": {},
        "comparisons": {},
    }
    try:
        import torch

        results["device"] = torch.cuda.get_device_name()
    except Exception:  # noqa: BLE001
        pass
    batches = [int(b) for b in args.batches.split(",")]
    cpus = None
    if args.pin_cpus:
        wanted = _gpu_local_cpus() if args.pin_cpus == "gpu" else cpu_list(args.pin_cpus)
        cpus = results["pinned_cpus"] = pinned_cpus(wanted, os.sched_getaffinity(0))
        print(f"engines pinned to CPUs {cpus}", flush=True)
    profile_batches = [int(b) for b in args.profile_batch.split(",")] if args.profile else []
    for round_, name in [(r, n) for r in range(args.repeat) for n in names]:
        what, kwargs, baseline, expect = CASES[name]
        if round_:
            _repeat(
                name,
                work,
                results["cases"],
                batches,
                _engine_env(name, work, args.own_compile_cache, cpus, args.blocking_sync),
            )
            if args.json:
                Path(args.json).write_text(json.dumps(_summary(results), indent=1))
            continue
        try:
            model = _model(what, work, src, args.ct_site)
            hub = _hub_cache(Path(model), work) if kwargs.get(_HUB) else None
        except Exception as e:  # noqa: BLE001
            results["cases"][name] = {"ok": False, "error": f"repack failed: {e}"}
            print(f"== {name}: repack failed: {e}", flush=True)
            continue
        if args.own_compile_cache:  # the script's own folder: the first round compiles afresh
            shutil.rmtree(work / "vllm-cache" / name, ignore_errors=True)
        out = work / f"case-{name}.json"
        out.unlink(missing_ok=True)
        t = time.perf_counter()
        ended = _subprocess(
            [
                "_engine",
                hub["repo"] if hub else str(model),
                str(out),
                json.dumps(kwargs | {_PROFILE: profile_batches, _BATCHES: batches}),
            ],
            work / f"case-{name}.log",
            _engine_env(name, work, args.own_compile_cache, cpus, args.blocking_sync),
        )
        rec = json.loads(out.read_text()) if out.exists() else {"ok": False, "error": ended or "no record (crashed)"}
        if hub is not None:  # which identity the engine recorded: the folder's (offline, vLLM 0.26) or the commit's
            found = rec.get("weights_identity")
            hub["identity_is"] = {hub["folder_identity"]: "folder", f"hub:{hub['commit']}": "hub"}.get(found, "other")
            rec["hub"] = hub
        rec["wall_s"] = time.perf_counter() - t
        rec["expect"] = expect
        results["cases"][name] = rec
        line = {
            k: (round(v, 3) if isinstance(v, float) else v)
            for k, v in rec.items()
            if k
            in (
                "ok",
                "ready_s",
                "weight_phase_s",
                "load_peak_gib",
                "load_end_gib",
                "error",
                "cuda_sync",
                "after_sleep_identical",
                "counters_nonzero_after_wake",
                "weights_identity",
                "hub",
                "host",
            )
            or _is_decode_speed(k)
            or _is_decode_cpu(k)
        }
        print(f"== {name}: {line}", flush=True)
        for prof in (v for k, v in rec.items() if k.startswith("profile_batch")):
            print(
                f"   profile at {prof['batch']} sequences: {prof['ms_per_step_profiled']:.2f} ms a step, of which GPU "
                f"kernels {prof['gpu_kernel_ms_per_step']:.2f} ms summed, {prof['gpu_busy_ms_per_step']:.2f} busy (MoE "
                f"{prof['moe_busy_ms_per_step']:.2f}); host calls {prof['runtime_calls'][:4]}",
                flush=True,
            )
        if not rec.get("ok"):
            print(rec.get("traceback", (work / f"case-{name}.log").read_text()[-4000:])[-3000:], flush=True)
        if baseline and baseline not in results["cases"] and (work / f"case-{baseline}.json").exists():
            # measured by an earlier call on this machine, same work folder and fixture
            results["cases"][baseline] = json.loads((work / f"case-{baseline}.json").read_text())
            results["cases"][baseline]["from_earlier_call"] = True
        if baseline and baseline in results["cases"]:
            cmp = compare(rec, results["cases"][baseline])
            results["comparisons"][f"{name} vs {baseline}"] = cmp
            print(f"   vs {baseline}: {cmp}", flush=True)
        stock = stock_case(name)
        if stock not in (None, baseline) and stock in results["cases"]:  # and with stock vLLM in the same mode
            cmp = compare(rec, results["cases"][stock])
            results["comparisons"][f"{name} vs {stock}"] = cmp
            print(f"   vs {stock}: {cmp}", flush=True)
        if args.json:  # after every case: a run stopped at its time limit keeps what it measured
            Path(args.json).write_text(json.dumps(_summary(results), indent=1))
    if args.convert:
        for target in ("sm80", "sm90", "sm100", "sm121"):
            try:  # one that does not repack is that target's error in the conversions (its folder missing)
                _model(target, work, src)
            except Exception as e:  # noqa: BLE001
                print(f"{target}: repack failed: {e}", flush=True)
        out = work / "convert.json"
        _subprocess(["_convert", str(work), str(out)], work / "convert.log")
        results["conversions"] = (
            json.loads(out.read_text()) if out.exists() else {"error": (work / "convert.log").read_text()[-3000:]}
        )
        print(json.dumps(results["conversions"])[:3000], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(_summary(results), indent=1))


_TIMES = ("ready_s", "weight_phase_s", "load_peak_gib")


def _is_decode_speed(key: str) -> bool:
    """A record's median decode speed at one batch size (``decode_tok_s_batch<N>``, not its list of runs)."""
    return key.startswith("decode_tok_s_batch") and not key.endswith("_runs")


def _is_decode_cpu(key: str) -> bool:
    """A record's median host CPU time a decode step at one batch size (not its list of runs)."""
    return key.startswith("decode_cpu_ms_per_step_batch") and not key.endswith("_runs")


def _times(rec: dict) -> dict:
    """What a round of a case keeps: its load times, its decode speeds and their host CPU time a step."""
    return {k: v for k, v in rec.items() if k in _TIMES or _is_decode_speed(k) or _is_decode_cpu(k)}


def _round(rec: dict) -> dict:
    """A round as ``rounds`` keeps it: its :func:`_times` and each decode run's figures (speed, CPU time, preemptions,
    core, GPU clocks, steal) and the GPU sampler's status, so that a later round's slow runs read as the first's."""
    times = _times(rec)
    return times | {k: v for k, v in rec.items() if k.startswith("decode_") and k not in times}


def _repeat(name: str, work: Path, cases: dict, batches: list[int], env: dict) -> None:
    """A later round of one case: the same engine run again (same checkpoint, kwargs), its times (load and decode
    speed, the medians over rounds) and its runs' figures kept (:func:`_round`), and its logprobs compared with the
    first round's (a second start reuses vLLM's compile cache)."""
    rec = cases.get(name)
    if not (rec and rec.get("ok")):
        return
    out = work / f"case-{name}-again.json"
    out.unlink(missing_ok=True)
    log = work / f"case-{name}-again.log"
    ended = _subprocess(
        ["_engine", str(rec["model"]), str(out), json.dumps(CASES[name][1] | {_BATCHES: batches})], log, env
    )
    again = json.loads(out.read_text()) if out.exists() else {"ok": False, "error": ended or "no record (crashed)"}
    runs = rec.setdefault("rounds", [_round(rec)])
    if again.get("ok"):  # and its outputs against the first round's: two starts of one engine, same checkpoint
        sync = {"cuda_sync": again["cuda_sync"]} if "cuda_sync" in again else {}  # --blocking-sync's, each round's
        runs.append(_round(again) | sync | {"host": again.get("host"), "vs_first_round": compare(again, rec)})
    else:  # kept with its reason: the medians are of the rounds that ran
        runs.append({"error": again.get("error", "failed"), "log": str(log)})
    for k in _times(rec):
        vals = [r[k] for r in runs if k in r]
        if vals:
            rec[f"median_{k}"] = statistics.median(vals)
    shown = []  # each run's figures stay in the record; the line shows each round's times
    for r in runs:
        times = _times(r)
        shown.append(
            {
                k: round(v, 3) if isinstance(v, float) else v
                for k, v in r.items()
                if k in times or not k.startswith("decode_")
            }
        )
    print(f"== {name} (round {len(runs)}): {shown}", flush=True)


def _summary(results: dict) -> dict:
    """The record without the per-token outputs (those stay in the case files)."""
    return {
        **results,
        "cases": {
            k: {kk: vv for kk, vv in v.items() if kk not in ("outputs", "after_sleep_outputs")}
            for k, v in results["cases"].items()
        },
    }


if __name__ == "__main__":
    main()
