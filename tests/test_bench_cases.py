"""The plugin check's case table (benchmarks/vllm_plugin_check.py) is consistent: it runs only on the GPU machine,
where a typo in a case costs a device call. No vLLM, no GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

from mxrepack.recipes import builtin_names

ROOT = Path(__file__).resolve().parents[1]


def _check_module():
    spec = importlib.util.spec_from_file_location("vllm_plugin_check", ROOT / "benchmarks" / "vllm_plugin_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_case_names_a_checkpoint_and_a_known_baseline():
    check = _check_module()
    checkpoints = {"source", "marlin-dense-twin", *check.RECIPES, *builtin_names()}
    for name, (what, kwargs, baseline, expect) in check.CASES.items():
        assert what in checkpoints, f"case {name}: {what!r} is neither a target, a recipe nor the source"
        assert baseline is None or baseline in check.CASES, f"case {name}: baseline {baseline!r} is not a case"
        assert baseline != name and expect, name
        # the check's private keys are popped before LLM(...); anything else must be an LLM argument, not a typo of one
        assert not {k for k in kwargs if k.startswith("_")} - {check._ENV, check._SLEEP, check._HUB}, name
        assert all(isinstance(v, str) for v in kwargs.get(check._ENV, {}).values()), f"case {name}: env values are str"
        # a sleep case sleeps at a level vLLM has, in an engine started with sleep mode on
        assert kwargs.get(check._SLEEP, 0) in (0, 1, 2) and bool(kwargs.get(check._SLEEP)) <= bool(
            kwargs.get("enable_sleep_mode")
        ), name


def test_every_check_recipe_is_a_valid_recipe_and_no_target_of_that_name(tmp_path):
    # the check writes each as a recipe file (_model): one that repack refuses costs a device call
    import yaml

    from mxrepack.recipes import load_recipe

    check = _check_module()
    for name, data in check.RECIPES.items():
        f = tmp_path / f"{name}.yaml"
        f.write_text(yaml.safe_dump(data))
        assert load_recipe(path=f).name == name
        assert name not in builtin_names(), f"recipe {name} would shadow the built-in target"


def test_the_sm121_cases_compare_its_experts_then_its_dense_layers():
    """sm121-experts-graphs is the sm121 target's experts with BF16 dense layers (so against stock vLLM's FlashInfer
    CUTLASS MXFP4 x MXFP8 backend on the source only the experts can differ), and sm121-graphs the target itself
    against it (only the dense layers differ): all three in the same mode."""
    from mxrepack.recipes import load_recipe

    check = _check_module()
    sm121, experts = load_recipe("sm121").data, check.RECIPES["sm121-experts"]
    assert experts["experts"] == sm121["experts"] and experts["config"] == sm121["config"]
    assert experts["dense"] == {"format": "bf16"} and sm121["dense"]["format"] == "mxfp4"
    stock = check.CASES["source-flashinfer-cutlass-mxfp8-graphs"]
    assert stock[0] == "source" and stock[1]["moe_backend"] == "flashinfer_cutlass_afp8" and stock[2] is None
    assert check.CASES["sm121-experts-graphs"][:3] == (
        "sm121-experts",
        check._GRAPHS,
        "source-flashinfer-cutlass-mxfp8-graphs",
    )
    assert check.CASES["sm121-graphs"][:3] == ("sm121", check._GRAPHS, "sm121-experts-graphs")
    mode = {k: v for k, v in stock[1].items() if k != "moe_backend"}
    assert mode == check._GRAPHS  # stock Marlin's graphs mode, the MoE backend aside
    # and each plugin case is also compared with stock vLLM's Marlin in that mode
    assert check.stock_case("sm121-experts-graphs") == check.stock_case("sm121-graphs") == "source-marlin-graphs"


def _gb10_cases() -> list[str]:
    """The plugin check's cases benchmarks/gb10_check.sh runs: its PLUGIN_CASES array, one name a line."""
    text = (ROOT / "benchmarks" / "gb10_check.sh").read_text()
    block = text.split("PLUGIN_CASES=(", 1)[1].split("\n)", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_gb10_check_runs_known_cases_each_after_its_baseline():
    check = _check_module()
    cases = _gb10_cases()
    assert len(cases) == len(set(cases)) >= 6 and all(" " not in c for c in cases), cases
    assert not set(cases) - set(check.CASES), f"not cases of vllm_plugin_check.py: {set(cases) - set(check.CASES)}"
    for wanted in (
        "source-marlin-graphs",
        "source-flashinfer-cutlass-mxfp8-graphs",
        "sm121-experts-graphs",
        "sm121-graphs",
        "strided-mma2-graphs",
        "dense-mma2-graphs",
    ):
        assert wanted in cases, wanted
    # a case run for its own comparison has its baseline run before it (the comparison is made when the case ends); a
    # case there only as another's baseline (marlin-dense-graphs, for dense-mma2-graphs) may leave out its own
    baselines = {check.CASES[c][2] for c in cases}
    for i, name in enumerate(cases):
        baseline = check.CASES[name][2]
        if baseline is not None and name not in baselines:
            assert baseline in cases[:i], f"{name} runs before its baseline {baseline}"
        stock = check.stock_case(name)
        assert stock is None or stock in cases[:i], f"{name}: stock vLLM's {stock} does not run before it"


def test_gb10_check_passes_flags_the_scripts_take():
    # the flags gb10_check.sh gives each program, against each one's source (a typo costs a GB10 owner's afternoon)
    import re

    text = (ROOT / "benchmarks" / "gb10_check.sh").read_text().replace("\\\n", " ")  # continued lines joined
    programs = {
        r"benchmarks/vllm_plugin_check\.py": ROOT / "benchmarks" / "vllm_plugin_check.py",
        r"benchmarks/peers\.py": ROOT / "benchmarks" / "peers.py",
        r"mxrepack\.cli kernels check": ROOT / "mxrepack" / "cli.py",
    }
    for program, source in programs.items():
        calls = re.findall(program + r" [^\n]*", text)
        flags = {f for call in calls for f in re.findall(r"(--[a-z][a-z-]*)", call)}
        assert calls and flags, program
        missing = {f for f in flags if f'"{f}"' not in source.read_text()}
        assert not missing, f"{source.name} takes no {', '.join(sorted(missing))}"


def _engine_script(path: Path, child_pid: Path, then: str) -> Path:
    """A stand-in engine: starts a child of its own (a compile worker) that would sleep for a minute, writes the
    child's pid, prints, then runs ``then``."""
    path.write_text(
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(child_pid)!r}, 'w').write(str(c.pid))\n"
        f"print('compiling', flush=True)\n{then}\n"
    )
    return path


def _gone(pid: int) -> bool:
    """Whether ``pid`` is dead (a zombie not yet reaped counts) within five seconds."""
    for _ in range(50):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] == "Z":
                return True
        except FileNotFoundError:  # gone and reaped
            return True
        time.sleep(0.1)
    return False


def test_an_engine_past_its_time_limit_is_its_cases_error_not_the_runs_end(tmp_path, monkeypatch):
    # a GB10's first engine may compile FlashInfer's kernels for a long time: killed at --engine-timeout, its case
    # gets an error row (the reason _subprocess returns) and the log keeps what it printed, where it used to raise;
    # the engine's own children die with it (left running, they would hold the GPU for the next case)
    check = _check_module()
    child = tmp_path / "child.pid"
    monkeypatch.setattr(check, "__file__", str(_engine_script(tmp_path / "slow.py", child, "time.sleep(60)")))
    log = tmp_path / "case.log"
    assert check._subprocess([], log, timeout=2) == "no record (killed after 2 s: --engine-timeout)"
    assert log.read_text().startswith("compiling") and "killed after 2 s" in log.read_text()
    assert _gone(int(child.read_text())), "the engine's child outlived the kill"
    # an engine that ends by itself: its record, and nothing of its session left running either
    monkeypatch.setattr(check, "__file__", str(_engine_script(tmp_path / "quick.py", child, "print('ok')")))
    start = time.monotonic()
    assert check._subprocess([], log, timeout=30) is None and log.read_text() == "compiling\nok\n"
    assert time.monotonic() - start < 20 and _gone(int(child.read_text())), "a child left by the engine kept running"


def test_unknown_cases_are_refused_before_anything_is_built(tmp_path, monkeypatch, capsys):
    check = _check_module()
    work = tmp_path / "work"
    monkeypatch.setattr(
        sys, "argv", ["vllm_plugin_check.py", "--work", str(work), "--cases", "sm121-graphs,sm121-graph"]
    )
    with pytest.raises(SystemExit):
        check.main()
    assert "unknown case(s) sm121-graph" in capsys.readouterr().err and not work.exists()


def test_each_case_is_also_compared_with_stock_vllm_in_its_mode():
    check = _check_module()
    assert check.stock_case("strided") == "source-marlin"
    assert check.stock_case("strided-wgmma-graphs") == "source-marlin-graphs"
    assert check.stock_case("strided-mma2-graphs") == "source-marlin-mmav2-graphs"  # DISABLE_MMA_V3 too
    assert check.stock_case("source-marlin") is None and check.stock_case("source-marlin-graphs") is None
    for name in check.CASES:  # a stock case, when found, runs in the same mode as the case
        stock = check.stock_case(name)
        if stock is not None:
            drop = {"moe_backend"}
            mode = {k: v for k, v in check.CASES[name][1].items() if k not in drop}
            assert mode == {k: v for k, v in check.CASES[stock][1].items() if k not in drop}, name


def test_timed_sequences_have_their_own_prompts():
    check = _check_module()
    prompts = [tuple(check._prompt(i)) for i in range(64)]
    assert len(set(prompts)) == 64 and [list(p) for p in prompts[:3]] == check.PROMPTS


def test_a_repeated_round_keeps_load_times_and_decode_speeds(tmp_path, monkeypatch):
    check = _check_module()
    seen = []

    def engine(args, log, env=None):  # the engine subprocess: writes the later round's record
        seen.append(json.loads(args[3]))
        again = {
            "ok": True,
            "ready_s": 3.0,
            "decode_tok_s_batch64": 300.0,
            "decode_cpu_ms_per_step_batch64": 2.0,
            "decode_cpu_ms_per_step_batch64_runs": [2.0],
            "host": {"cpus": 8},
            "outputs": [output],
        }
        Path(args[2]).write_text(json.dumps(again))

    output = {
        "tokens": [5, 6],
        "prompt_logprobs": [{"1": -0.5}],
        "logprobs": [{"5": -0.25}, {"6": -1.0}],
    }  # as JSON has it
    monkeypatch.setattr(check, "_subprocess", engine)
    first = {
        "ok": True,
        "model": "m",
        "ready_s": 1.0,
        "decode_tok_s_batch64": 100.0,
        "decode_tok_s_batch64_runs": [1],
        "decode_cpu_ms_per_step_batch64": 4.0,
        "outputs": [output],
    }
    cases = {"strided-graphs": first}  # the first round's host stays at the record's top level, as _engine wrote it
    check._repeat("strided-graphs", tmp_path, cases, [1, 64], {})
    assert seen[0][check._BATCHES] == [1, 64]  # the later round's engine times the same batch sizes
    vs_first = first["rounds"][1].pop("vs_first_round")  # its outputs against the first round's: the same here
    assert vs_first["bit_identical"] and vs_first["logprobs_compared"] == 3
    assert first["rounds"] == [  # each round with its runs' figures (stop 51: a later round's were dropped)
        {
            "ready_s": 1.0,
            "decode_tok_s_batch64": 100.0,
            "decode_tok_s_batch64_runs": [1],
            "decode_cpu_ms_per_step_batch64": 4.0,
        },
        {
            "ready_s": 3.0,
            "decode_tok_s_batch64": 300.0,
            "decode_cpu_ms_per_step_batch64": 2.0,
            "decode_cpu_ms_per_step_batch64_runs": [2.0],
            "host": {"cpus": 8},
        },
    ]
    assert not [k for k in first if k.startswith("median_") and k.endswith("_runs")]  # medians of figures, not lists
    assert first["median_ready_s"] == 2.0 and first["median_decode_tok_s_batch64"] == 200.0
    assert first["median_decode_cpu_ms_per_step_batch64"] == 3.0


def test_engines_can_be_pinned_to_a_cpu_list(tmp_path):
    check = _check_module()
    assert check.cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}  # as sysfs' local_cpulist writes it
    assert check.cpu_text({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    # nvidia-smi's bus id (8-digit domain, upper-case hex) -> sysfs' device folder (4 digits, lower case)
    assert check.pci_cpulist_path("00000000:9B:00.0\n").parent.name == "0000:9b:00.0"
    # a NUMA node's CPUs within those the process may use; none left is one line, before any engine starts
    assert check.pinned_cpus({0, 1, 2, 3, 4, 5, 6, 7}, {4, 5, 6, 7, 8, 9}) == "4-7"
    with pytest.raises(SystemExit, match="none of CPUs 0-3 is allowed here"):
        check.pinned_cpus({0, 1, 2, 3}, {8, 9})
    assert check._engine_env("marlin-dense-graphs", tmp_path, own_cache=False, cpus="0-3")[check._CPUS_ENV] == "0-3"
    assert check._CPUS_ENV not in check._engine_env("marlin-dense-graphs", tmp_path, own_cache=False)
    # --blocking-sync: the engine sets its CUDA context to block in a sync before creating it (stop 51's next test)
    env = check._engine_env("marlin-dense-graphs", tmp_path, own_cache=False, blocking_sync=True)
    assert env[check._SYNC_ENV] == "blocking"
    assert check._SYNC_ENV not in check._engine_env("marlin-dense-graphs", tmp_path, own_cache=False)
    assert check._blocking_sync("libcuda-not-here.so.1")["blocking"] is False  # no driver: said, not raised


class _FakeDriver:
    """The four CUDA driver calls ``_blocking_sync`` makes, on a stored flags word (no GPU)."""

    def __init__(self, flags=0, v2=True, fail_init=0):
        self.flags, self.fail_init = flags, fail_init
        if v2:
            self.cuDevicePrimaryCtxSetFlags_v2 = self._set

    def cuInit(self, _):
        return self.fail_init

    def cuDeviceGet(self, dev, ordinal):
        dev._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxGetState(self, dev, flags, active):
        flags._obj.value, active._obj.value = self.flags, 0
        return 0

    def _set(self, dev, flags):
        self.flags = flags.value
        return 0

    def cuDevicePrimaryCtxSetFlags(self, dev, flags):  # the unversioned name, where no _v2 is exported
        return self._set(dev, flags)


@pytest.mark.parametrize(
    "driver,expect",
    [
        (_FakeDriver(), {"set": 0, "flags": 4, "active": False, "blocking": True}),
        (_FakeDriver(flags=0x10 | 0x2), {"set": 0, "flags": 0x14, "active": False, "blocking": True}),  # keeps 0x10
        (_FakeDriver(v2=False), {"set": 0, "flags": 4, "active": False, "blocking": True}),
    ],
)
def test_blocking_sync_sets_the_primary_contexts_scheduling_flags(monkeypatch, driver, expect):
    """--blocking-sync: the driver's primary-context flags get CU_CTX_SCHED_BLOCKING_SYNC in their scheduling field
    (other flags kept), through cuDevicePrimaryCtxSetFlags_v2 or the unversioned call; a failing or incomplete driver
    is said in the result (``blocking`` False: the engine then refuses to time), never raised."""
    import ctypes

    check = _check_module()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: driver)
    assert check._blocking_sync() == expect
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _FakeDriver(fail_init=3))
    assert check._blocking_sync() == {
        "error": "the CUDA driver's calls returned {'init': 3, 'device': 3, 'get': 3}",
        "blocking": False,
    }
    monkeypatch.setattr(ctypes, "CDLL", lambda name: object())  # a library without the calls
    result = check._blocking_sync()
    assert result["blocking"] is False and "AttributeError" in result["error"]
    host = check._host_state()
    assert host["cpus"] == len(check.cpu_list(host["affinity"])) >= 1 and len(host["loadavg"]) == 3
    # each decode run's core and its clock (stop 49): a core this process may use; the clock where the host shows one
    core = check._main_thread_core()
    assert core["core"] in os.sched_getaffinity(0) and (core["mhz"] is None or core["mhz"] > 0)
    # and the share of CPU time the hypervisor took during a run (stop 51), over all CPUs and on that core
    before = check._cpu_ticks()
    sum(range(200000))
    steal = check._steal(before, check._cpu_ticks(), core["core"])
    assert set(steal) == {"all", "core"}
    assert all(v is None or 0.0 <= v <= 1.0 for v in steal.values())
    assert check._steal({"cpu": (5, 100), "cpu3": (1, 50)}, {"cpu": (15, 300), "cpu3": (1, 50)}, 3) == {
        "all": 0.05,  # 10 of 200 ticks stolen
        "core": None,  # no tick passed on cpu3
    }
    assert check._steal({}, {"cpu": (0, 10)}, 0) == {"all": None, "core": None}
    # /proc/stat's fields: user nice system idle iowait irq softirq steal (guest and guest_nice, counted in user and
    # nice, left out)
    stat = "cpu  1 2 3 4 5 6 7 8 9 10\ncpu0 1 1 1 1 1 1 1 2 0 0\nintr 5 6\n\nctxt 7\n"
    assert check._cpu_ticks(stat) == {"cpu": (8, 36), "cpu0": (2, 9)}


def test_decode_runs_get_the_gpu_samples_taken_during_them(tmp_path):
    """``GpuSampler``: nvidia-smi's timestamped lines (UTC), each run given the samples inside it; a field it could not
    read left out of its figure; none where the tool is missing, with the reason in ``status``."""
    import time

    check = _check_module()
    lines = "2026/11/29 14:05:01.123, 1980, 3201, 412.35, 0x0000000000000001\n[N/A], x\n"
    lines += "2026/11/29 14:05:01.143, 1965, 3201, [N/A], [Not Supported]\nNo devices were found\n"
    assert check.gpu_samples(lines) == [
        (_utc_epoch("2026/11/29 14:05:01.123"), 1980.0, 3201.0, 412.35, 1),
        (_utc_epoch("2026/11/29 14:05:01.143"), 1965.0, 3201.0, None, None),
    ]

    def stand_in(name: str, samples: int | None) -> Path:  # nvidia-smi's stand-in: the time as TZ=UTC makes it
        fake = tmp_path / name
        loop = f"for _ in range({samples})" if samples else "while True"
        fake.write_text(
            f"#!{sys.executable}\nimport datetime, sys, time\n"
            "assert any(a.startswith('--loop-ms=') for a in sys.argv) and '-i' in sys.argv\n"
            f"{loop}:\n"
            "    now = datetime.datetime.now().strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]\n"
            "    print(f'{now}, 1755, 3201, 150.5, 0x0000000000000004', flush=True)\n"
            "    time.sleep(0.02)\n"
        )
        fake.chmod(0o755)
        return fake

    # five samples 20 ms apart, then it exits (waited for, so that no timing decides what the sampler saw)
    t0 = time.time() - 1  # the stand-in's timestamps are in ms
    with check.GpuSampler(command=str(stand_in("five", 5))) as gpu:
        assert gpu._proc is not None
        gpu._proc.wait(timeout=120)
    t1 = time.time() + 1
    run = gpu.during(t0, t1)
    assert run["sm_mhz"] == [1755.0, 1755.0, 1755.0] and run["power_w"] == 150.5 and run["reasons"] == ["0x4"]
    assert run["samples"] == 5 and gpu.status["samples"] == 5 and gpu.status["returncode"] == 0
    mid = (gpu.samples[1][0] + gpu.samples[2][0]) / 2  # a run that ended between the second and third sample
    assert gpu.during(t0, mid)["samples"] == 2 and gpu.during(mid, t1)["samples"] == 3
    assert gpu.during(t1 + 10, t1 + 11) is None
    # one that samples until the block ends: stopped and reaped, its samples kept (the block waits for its first)
    with check.GpuSampler(command=str(stand_in("loop", None))) as gpu:
        assert gpu.status["started"]
    assert gpu._proc.returncode is not None and gpu.status["samples"] >= 1
    with check.GpuSampler(command=str(tmp_path / "missing")) as gpu:
        pass
    assert gpu.during(0, time.time()) is None and gpu.status["samples"] == 0 and gpu.status["returncode"] != 0


def _utc_epoch(text: str) -> float:
    from datetime import datetime, timezone

    return datetime.strptime(text, "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()


def test_a_hub_case_serves_the_folder_from_an_offline_cache(tmp_path):
    # what vLLM finds for a repo id there: the folder's files as the snapshot of refs/main, no network
    from huggingface_hub import try_to_load_from_cache

    check = _check_module()
    folder = tmp_path / "sm121-strided"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x")  # no mxrepack manifest: named by its files
    hub = check._hub_cache(folder, tmp_path)
    env = check._engine_env("dense-wgmma-hub", tmp_path, own_cache=False)
    assert hub["repo"] == "mxrepack-check/sm121-strided" and env["HF_HUB_OFFLINE"] == "1"
    assert hub["folder_identity"].startswith("files:")
    found = try_to_load_from_cache(hub["repo"], "config.json", cache_dir=env["HF_HUB_CACHE"])
    assert Path(found).parent.name == hub["commit"] and Path(found).read_text() == "{}"
    # written again, with a file gone: another commit, its links made afresh
    (folder / "model.safetensors").write_bytes(b"xy")
    (folder / "config.json").unlink()
    again = check._hub_cache(folder, tmp_path)
    assert again["commit"] != hub["commit"]
    assert try_to_load_from_cache(hub["repo"], "config.json", cache_dir=env["HF_HUB_CACHE"]) is None
    assert check._hub_cache(folder, tmp_path) == again  # made again over its own links


def test_each_case_has_its_own_compile_cache_when_asked(tmp_path):
    check = _check_module()
    assert "VLLM_CACHE_ROOT" not in check._engine_env("source-marlin-graphs", tmp_path, own_cache=False)
    own = {
        n: check._engine_env(n, tmp_path, own_cache=True)["VLLM_CACHE_ROOT"]
        for n in ("source-marlin-graphs", "dense-wgmma-graphs")
    }
    assert len(set(own.values())) == 2 and all(v.startswith(str(tmp_path)) for v in own.values())


def test_gpu_busy_time_counts_overlapping_kernels_once():
    # a kernel launched under PDL starts inside the one before it: the profile's busy time is their union
    check = _check_module()
    assert check._union_us([(0.0, 10.0), (5.0, 12.0), (20.0, 25.0), (21.0, 22.0)]) == 17.0
    assert check._union_us([]) == 0.0


def test_profile_timeline_is_relative_to_its_first_kernel():
    check = _check_module()
    kernels = [(100.0, 112.34, "gate_up"), (101.0, 130.0, "down")]
    assert check._timeline(kernels) == [("gate_up", 0.0, 12.3), ("down", 1.0, 30.0)]
    assert check._timeline([]) == []


def test_the_profile_marks_lm_head_once_whoever_serves_it():
    # vLLM calls lm_head's quant method outside its graphs at every step; the profile times that call in a range of
    # its own (Marlin's apply or the plugin's direct launch alike), wrapped once however often it is asked
    import types

    import torch
    from torch.profiler import ProfilerActivity, profile

    check = _check_module()

    class Method:
        def apply(self, layer, x, bias=None):
            return x @ layer.weight.T

    head = types.SimpleNamespace(weight=torch.ones(8, 4), quant_method=Method())
    worker = types.SimpleNamespace(
        model_runner=types.SimpleNamespace(get_model=lambda: types.SimpleNamespace(lm_head=head))
    )
    assert check._mark_lm_head(worker) == check._mark_lm_head(worker) == "Method"
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            out = head.quant_method.apply(head, torch.ones(2, 4), bias=None)
    assert out.shape == (2, 8) and float(out[0, 0]) == 4.0
    assert sum(e.name == check._LM_HEAD_RANGE for e in prof.events()) == 3


def test_the_lm_head_range_is_no_kernel_and_no_host_op():
    # the range's GPU-side span covers lm_head's kernels: counted as a kernel it added itself to the GPU time (85a77a1)
    import types

    check = _check_module()
    cpu, cuda = "cpu", "cuda"

    def event(name, device, start, end, self_cpu=0.0, cpu_total=0.0):
        return types.SimpleNamespace(
            name=name,
            device_type=device,
            time_range=types.SimpleNamespace(start=start, end=end),
            device_time_total=end - start,
            self_cpu_time_total=self_cpu,
            cpu_time_total=cpu_total,
        )

    events = [
        event(check._LM_HEAD_RANGE, cpu, 0.0, 50.0, self_cpu=30.0, cpu_total=50.0),
        event(check._LM_HEAD_RANGE, cuda, 60.0, 160.0),
        event("marlin::Marlin", cuda, 61.0, 159.0),
        event("_gate_up_kernel", cuda, 200.0, 220.0),
        event("cuLaunchKernelEx", cpu, 10.0, 12.0),
        event("aten::argmax", cpu, 51.0, 55.0, self_cpu=4.0),
    ]
    t = check._tally(events, cuda)
    assert t.lm_head_calls == [50.0] and t.lm_head_gpu == [100.0]
    assert dict(t.kernel_us) == {"marlin::Marlin": 98.0, "_gate_up_kernel": 20.0}
    assert check._union_us(t.spans) == 118.0 and t.moe_spans == [(200.0, 220.0)]
    assert dict(t.host_us) == {"aten::argmax": 4.0} and dict(t.runtime) == {"cuLaunchKernelEx": 1}
    assert "mxrepack" not in check._LM_HEAD_RANGE  # host_mxrepack_us_per_step counts names holding it
