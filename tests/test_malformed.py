"""Malformed inputs and interrupted runs (an audit's findings): each is one line naming the file or tensor, never a
traceback; nothing half-written is left beside the output; one writer per path."""

import json
import os
import re
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mxrepack.errors import MxRepackError
from mxrepack.repack.pipeline import repack


def _shard(d: Path) -> Path:
    return d / "model-00000-of-00000.safetensors"


def _rewrite_header(path: Path, change) -> None:
    """``change(header)`` on a safetensors file's header, the data kept where it is (offsets are relative to it)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    change(header)
    new = json.dumps(header).encode()
    new += b" " * (-(len(new) + 8) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])


def _index(d: Path, change) -> None:
    path = d / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    change(index["weight_map"])
    path.write_text(json.dumps(index))


def _bad_overlap(d):
    def change(h):  # lm_head reads the embeddings' bytes: the same shape and dtype, so sizes agree
        h["lm_head.weight"]["data_offsets"] = h["model.embed_tokens.weight"]["data_offsets"]

    _rewrite_header(_shard(d), change)
    return "corrupted safetensors header: tensors 'lm_head.weight' and 'model.embed_tokens.weight' overlap"


def _bad_negative_offset(d):
    def change(h):
        begin, end = h["model.norm.weight"]["data_offsets"]
        h["model.norm.weight"]["data_offsets"] = [-2, end - begin - 2]

    _rewrite_header(_shard(d), change)
    return "tensor 'model.norm.weight' has a malformed or unsupported header entry"  # was "spans 576, expected 576"


def _bad_fractional_shape(d):
    _rewrite_header(_shard(d), lambda h: h["model.norm.weight"].update(shape=[288.5]))  # was read as 288
    return "tensor 'model.norm.weight' has a malformed or unsupported header entry"


def _bad_scalar_vector(d):
    def change(h):
        begin, _ = h["model.layers.0.self_attn.sinks"]["data_offsets"]
        h["model.layers.0.self_attn.sinks"].update(shape=[], data_offsets=[begin, begin + 2])

    _rewrite_header(_shard(d), change)  # was an IndexError traceback
    return "tensor 'model.layers.0.self_attn.sinks': shape [], expected [4] from config.json"


def _bad_index_value(d):
    _index(d, lambda wm: wm.update({"lm_head.weight": 5}))  # was a TypeError traceback (sorting int and str)
    return "model.safetensors.index.json: tensor 'lm_head.weight' maps to 5; expected the name of a .safetensors file"


def _bad_index_outside(d):
    _index(d, lambda wm: wm.update({"lm_head.weight": "../elsewhere.safetensors"}))
    return "tensor 'lm_head.weight' maps to '../elsewhere.safetensors'; expected the name of a .safetensors file in"


def _bad_index_incomplete(d):
    _index(d, lambda wm: wm.pop("model.norm.weight"))  # was "tensor 'model.norm.weight' is missing"
    return (
        "model.safetensors.index.json: does not list tensor 'model.norm.weight', which is in "
        "model-00000-of-00000.safetensors; the index is incomplete"
    )


def _bad_shard_is_a_folder(d):
    _shard(d).unlink()
    _shard(d).mkdir()
    return "model-00000-of-00000.safetensors: shard listed in model.safetensors.index.json is not a file"


def _bad_config_is_a_folder(d):
    (d / "config.json").unlink()
    (d / "config.json").mkdir()  # was an IsADirectoryError traceback
    return "config.json: cannot read the model config (config.json) (Is a directory)"


def _bad_f32_expert_bias(d):
    # an F32 expert bias was accepted, then a RuntimeError traceback (mxfp4, sm120/sm121) or a failed verify
    from safetensors.torch import load_file, save_file

    tensors = load_file(_shard(d))
    name = "model.layers.1.mlp.experts.down_proj_bias"
    tensors[name] = tensors[name].float()
    save_file(tensors, _shard(d), metadata={"format": "pt"})
    return f"tensor '{name}': dtype F32, expected BF16"


def _bad_bf16_experts(d):
    # a dequantized copy (as transformers saves gpt-oss after loading it in BF16) was "..._blocks is missing"
    from safetensors.torch import load_file, save_file

    tensors = load_file(_shard(d))
    for part in ("gate_up_proj", "down_proj"):
        name = f"model.layers.0.mlp.experts.{part}"
        blocks = tensors.pop(f"{name}_blocks")
        tensors.pop(f"{name}_scales")
        tensors[name] = torch.zeros(blocks.shape[0], blocks.shape[2] * 32, blocks.shape[1], dtype=torch.bfloat16)
    save_file(tensors, _shard(d), metadata={"format": "pt"})
    _index(d, lambda m: m.clear() or m.update(dict.fromkeys(tensors, _shard(d).name)))
    return (
        "tensor 'model.layers.0.mlp.experts.gate_up_proj' holds the experts as BF16 where gpt-oss stores them as "
        "MXFP4 ('model.layers.0.mlp.experts.gate_up_proj_blocks' and its _scales)"
    )


def _bad_quantization_config(d):
    # another quantization named over MXFP4 tensors was ignored (every target rewrites it)
    config = json.loads((d / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (d / "config.json").write_text(json.dumps(config))
    return "config.json: quantization_config says quant_method 'fp8', but the tensors are gpt-oss's MXFP4 experts"


BAD = [
    _bad_overlap,
    _bad_negative_offset,
    _bad_fractional_shape,
    _bad_scalar_vector,
    _bad_index_value,
    _bad_index_outside,
    _bad_index_incomplete,
    _bad_shard_is_a_folder,
    _bad_config_is_a_folder,
    _bad_f32_expert_bias,
    _bad_bf16_experts,
    _bad_quantization_config,
]


@pytest.mark.parametrize("damage", BAD, ids=lambda f: f.__name__[5:])
def test_malformed_source_is_one_line_and_leaves_nothing(tiny, copy_of, tmp_path, damage, refused_in_one_line):
    src = copy_of(tiny)
    message = damage(src)
    assert message in refused_in_one_line(src, tmp_path / "out", "mxfp4")


@pytest.mark.parametrize("rows", [-8, 8], ids=["too few", "too many"])
def test_original_fused_qkv_rows_must_match_the_config(tiny_original, copy_of, rows):
    """q, k and v are row ranges of the fused tensor: too few rows was a ValueError traceback at the read, too many
    were dropped without a word (and a 0-dim qkv bias read bytes of the tensors after it)."""
    import torch
    from safetensors.torch import load_file, save_file

    from mxrepack.repack.source import open_checkpoint

    src = copy_of(tiny_original)
    name = "block.0.attn.qkv.weight"
    tensors = load_file(_shard(src))
    qkv = tensors[name]
    tensors[name] = qkv[:rows].contiguous() if rows < 0 else torch.cat([qkv, qkv[:rows]])
    save_file(tensors, _shard(src), metadata={"format": "pt"})
    with pytest.raises(MxRepackError, match=rf"tensor '{name}' has shape \[\d+, 288\], expected 256 rows \(q, k and v"):
        open_checkpoint(str(src))


def _output(tiny, tmp_path) -> Path:
    return repack(str(tiny), "mxfp4", tmp_path / "out").out


def test_damaged_output_index_is_one_line_for_verify_push_and_eval(tiny, tmp_path):
    from mxrepack.eval.model import load_weights
    from mxrepack.repack.verify import verify_dir

    out = _output(tiny, tmp_path)
    (out / "model.safetensors.index.json").write_text("{")  # was a JSONDecodeError traceback in all three
    report = verify_dir(out, checksums=True, source=False)
    assert not report["ok"] and any("index.json: the shard index is not valid JSON" in p for p in report["problems"])
    for args in (["verify", str(out)], ["push", str(out), "--repo-id", "me/x", "--dry-run"]):
        proc = subprocess.run([sys.executable, "-m", "mxrepack.cli", *args], capture_output=True, text=True)
        assert proc.returncode == 1 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    with pytest.raises(MxRepackError, match="index.json: the shard index is not valid JSON"):
        load_weights(out)
    (out / "model.safetensors.index.json").write_text("{}")  # was a KeyError
    with pytest.raises(MxRepackError, match="index.json: no weight_map of tensor -> file name"):
        load_weights(out)


@pytest.mark.parametrize("damage", ["truncated shard", "missing shard", "config not JSON"])
def test_eval_reading_a_damaged_output_is_one_line(tiny, tmp_path, damage):
    """`eval logits/gpqa --local/serve` read an output without verifying it: a damaged one was a safetensors or JSON
    traceback."""
    from mxrepack.eval.model import load_weights

    out = _output(tiny, tmp_path)
    shard = next(out.glob("model-*.safetensors"))
    if damage == "truncated shard":
        shard.write_bytes(shard.read_bytes()[:1000])
        match = f"{shard.name}: cannot read it as safetensors"
    elif damage == "missing shard":
        shard.unlink()
        match = f"{shard.name}: cannot read it as safetensors"
    else:
        (out / "config.json").write_text("{")
        match = "config.json: the model config is not valid JSON"
    with pytest.raises(MxRepackError, match=match):
        load_weights(out)


def _unsealed(out: Path, keep: set[str]) -> None:
    """Cut the manifest to ``keep`` as a format 1 one (no digest: what verify accepts with a warning)."""
    m = json.loads((out / "mxrepack.json").read_text())
    cut = {k: v for k, v in m.items() if k in keep} | {"format": "mxrepack-manifest", "format_version": 1}
    (out / "mxrepack.json").write_text(json.dumps(cut))


def test_incomplete_unsealed_manifest_is_one_line(tiny, tmp_path):
    from mxrepack.eval.model import load_weights
    from mxrepack.repack.inspect import inspect_checkpoint
    from mxrepack.repack.verify import verify_dir

    out = _output(tiny, tmp_path)
    _unsealed(out, {"target", "source", "tensors", "tool", "created"})  # no files: verify's KeyError
    report = verify_dir(out, checksums=True, source=False)
    assert not report["ok"] and report["problems"] == [
        f"{out / 'mxrepack.json'}: incomplete manifest: no files; re-run repack"
    ]
    with pytest.raises(MxRepackError, match="incomplete manifest: no files"):
        load_weights(out)
    _unsealed(out, set())  # no target: KeyErrors in verify, eval, inspect and the report
    assert "no target name, recipe and recipe_source" in verify_dir(out, source=False)["problems"][0]
    with pytest.raises(MxRepackError, match="incomplete manifest: no target"):
        inspect_checkpoint(str(out))
    proc = subprocess.run(
        [sys.executable, "-m", "mxrepack.cli", "eval", "report", "--out", str(tmp_path / "rep"), "--model", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "incomplete manifest: no target" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "config, message",
    [
        (b"{", "config.json: the model config (config.json) is not valid JSON"),
        (b"\xff\xfe", "config.json: the model config (config.json) is not valid JSON"),
        (b"[1]", "config.json: expected a JSON object"),
    ],
)
def test_inspect_with_an_unreadable_config_is_one_line(tiny, copy_of, config, message):
    from mxrepack.repack.inspect import inspect_checkpoint

    src = copy_of(tiny)
    (src / "config.json").write_bytes(config)
    with pytest.raises(MxRepackError, match=re.escape(message)):
        inspect_checkpoint(str(src))


def test_inspect_with_a_quantization_config_that_is_no_object(tiny, copy_of):
    from mxrepack.repack.inspect import inspect_checkpoint

    src = copy_of(tiny)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "quantization_config": "mxfp4"}))  # was AttributeError
    assert inspect_checkpoint(str(src))["format"] == "quantized (unknown)"


def test_result_path_that_is_a_folder_is_refused_before_the_work(tiny, tmp_path, capsys):
    """`eval logits -o DIR` computed the result, then lost it with an IsADirectoryError traceback at the rename."""
    from mxrepack.cli import main

    folder = tmp_path / "results"
    folder.mkdir()
    assert main(["eval", "logits", str(tiny), str(tiny), "-o", str(folder)]) == 1
    assert main(["eval", "record-activations", str(tiny), str(folder)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err
        == [f"error: {folder}: is a folder; expected a file path for the result (e.g. {folder / 'result.json'})"] * 2
    )


def test_text_data_and_recipe_that_cannot_be_read(tmp_path):
    from mxrepack.errors import read_text
    from mxrepack.eval.gpqa_format import read_rows
    from mxrepack.recipes import load_recipe

    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xd5\xff\x00 not text")
    with pytest.raises(MxRepackError, match=r"binary.txt: not UTF-8 text \(byte 0\); expected a text"):
        read_text(binary, "a text")
    with pytest.raises(MxRepackError, match="binary.txt: not UTF-8 text .* gpqa_diamond.csv"):
        read_rows(binary)  # `eval gpqa --data`: was a UnicodeDecodeError traceback
    with pytest.raises(MxRepackError, match=r"recipe .*: cannot read it \(Is a directory\); expected a YAML file"):
        load_recipe(path=tmp_path)


def test_make_fixture_takes_the_output_lock(tmp_path):
    """A second make-fixture to one path removed the first's temporary folder under it and wrote into it (a
    traceback, and a fixture of mixed files); now it is refused as a second conversion is."""
    from mxrepack.repack.destination import OutputLock
    from mxrepack.repack.fixture import make_fixture

    out = tmp_path / "fx"
    with OutputLock(out.absolute()):
        with pytest.raises(MxRepackError, match="another repack is writing this output"):
            make_fixture(out, "tiny")
    assert not out.exists() and not list(tmp_path.glob(".fx.fixture-tmp*"))
    assert make_fixture(out, "tiny") == out and not list(tmp_path.glob(".fx.*"))


def test_second_interrupt_during_cleanup_still_removes_the_temporary_folder(tiny, tmp_path, monkeypatch):
    """Ctrl-C pressed again while an interrupted conversion removed its temporary folder stopped the removal
    (gigabytes left beside the output until the next run)."""
    import shutil

    from mxrepack.repack import pipeline

    real_rmtree = shutil.rmtree
    signalled = []

    def interrupted_write(tmp, *args, **kwargs):
        (tmp / "model-00001-of-00002.safetensors").write_bytes(b"x" * 1000)
        raise KeyboardInterrupt  # the first Ctrl-C

    def rmtree_with_a_second_ctrl_c(path, *args, **kwargs):
        if Path(path).is_dir() and not signalled:
            signalled.append(path)
            os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode: inside the removal
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(pipeline, "_write_weights", interrupted_write)
    monkeypatch.setattr(pipeline.shutil, "rmtree", rmtree_with_a_second_ctrl_c)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with pytest.raises(KeyboardInterrupt):
        repack(str(tiny), "mxfp4", tmp_path / "out")
    assert signalled and not list(tmp_path.glob(".out.*")) and not (tmp_path / "out").exists()
    assert {sig: signal.getsignal(sig) for sig in before} == before


@pytest.mark.parametrize("moment", ["rename", "report", "upload", "private upload"])
def test_ctrl_c_once_the_output_is_in_place_says_it_is_complete(tiny, tmp_path, monkeypatch, capsys, moment):
    """Ctrl-C in the moments after the final rename (or during the summary, or --push-to-hub's upload) said that
    nothing was written to the output path, which by then held the complete, verified output."""
    from mxrepack import hub
    from mxrepack.cli import main
    from mxrepack.repack import destination, pipeline
    from mxrepack.serve import spec

    def ctrl_c(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs at the next bytecode
        return real(*args, **kwargs)

    if moment == "rename":
        real = destination.replace_with
        monkeypatch.setattr(pipeline, "replace_with", ctrl_c)
    elif moment == "report":
        real = spec.serve_hint
        monkeypatch.setattr(spec, "serve_hint", ctrl_c)
    else:
        monkeypatch.setattr(hub, "hub_token", lambda: "hf_test")
        real = lambda plan: "https://huggingface.co/org/name"  # noqa: E731 - no network in tests
        monkeypatch.setattr(hub, "push", ctrl_c)
    out = tmp_path / "out"
    argv = [str(tiny), "--target", "mxfp4", "--out", str(out)]
    argv += {"upload": ["--push-to-hub", "org/name"], "private upload": ["--push-to-hub", "org/name", "--private"]}.get(
        moment, []
    )
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    assert main(argv) == 130
    assert {sig: signal.getsignal(sig) for sig in before} == before
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "nothing was written" not in err and err.startswith("error: interrupted ")
    if "upload" in moment:  # how to send it again, as private as asked
        again = f"`repack push {out} --repo-id org/name" + " --private" * (moment == "private upload") + "`"
        assert err.endswith(f"{out} is complete and verified ({again} uploads it)"), err
    else:
        assert err.endswith(f"{out} is complete and verified"), err
    assert main(["verify", str(out)]) == 0 and not list(tmp_path.glob(".out.*"))


def test_leftovers_of_killed_runs_go_even_when_their_pid_is_reused(tiny, tmp_path):
    """A killed run's temporary folder was kept while any process had its PID (reused, or a PID namespace's 1):
    under the output's lock none of them is still being written. Only this output's: `a?` is no pattern."""
    live = os.getpid()
    for name in (f".out.mxrepack-tmp-{live}", ".out.mxrepack-old-1", ".out.mxrepack-tmp-2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model-00001-of-00002.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "out").mkdir()  # the old output's place is taken: the set-aside one is garbage
    theirs = [tmp_path / ".out.mxrepack-notes", tmp_path / ".outer.mxrepack-tmp-3", tmp_path / ".a_.mxrepack-tmp-4"]
    for d in theirs:
        d.mkdir()
    with pytest.raises(MxRepackError, match="output already exists"):
        repack(str(tiny), "mxfp4", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.glob(".*")) == sorted(p.name for p in theirs)
    repack(str(tiny), "mxfp4", tmp_path / "a?")
    assert (tmp_path / ".a_.mxrepack-tmp-4").is_dir()


def test_an_output_set_aside_by_a_killed_run_is_put_back(tiny, tmp_path):
    """Killed between the two renames of an --overwrite (the old output set aside, the new not yet in place): the
    old output was deleted by the next run, even one without --overwrite."""
    out = tmp_path / "out"
    repack(str(tiny), "mxfp4", out)
    os.rename(out, tmp_path / f".out.mxrepack-old-{os.getpid()}")
    with pytest.raises(MxRepackError, match=re.escape("output already exists (put back from .out.mxrepack-old-")):
        repack(str(tiny), "bf16", out)
    assert (out / "mxrepack.json").is_file() and not list(tmp_path.glob(".out.*"))


def test_a_failed_second_rename_puts_the_old_output_back(tmp_path, monkeypatch):
    from mxrepack.repack import destination

    out, tmp = tmp_path / "out", tmp_path / ".out.new"
    out.mkdir()
    (out / "old").write_text("old")
    tmp.mkdir()
    real = os.rename

    def failing(src, dst):
        if Path(src) == tmp:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(destination.os, "rename", failing)
    with pytest.raises(OSError):
        destination.replace_with(out, tmp)
    assert (out / "old").read_text() == "old" and tmp.is_dir() and sorted(tmp_path.iterdir()) == [tmp, out]


def test_ctrl_c_while_a_failed_conversion_cleans_up_is_not_lost(tiny, tmp_path, monkeypatch):
    """A Ctrl-C during the cleanup of a conversion that failed (not one that was interrupted) was dropped: a batch
    of conversions went on to its end."""
    import shutil

    from mxrepack.repack import pipeline

    real_rmtree = shutil.rmtree

    def failed_verify(*args, **kwargs):
        return {"ok": False, "problems": ["a test's failure"]}

    def rmtree_with_ctrl_c(path, *args, **kwargs):
        if Path(path).is_dir():  # the cleanup's removal, not the one before the folder is made
            _sigint_soon()
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(pipeline, "verify_dir", failed_verify)
    monkeypatch.setattr(pipeline.shutil, "rmtree", rmtree_with_ctrl_c)
    with pytest.raises(KeyboardInterrupt) as e:
        repack(str(tiny), "mxfp4", tmp_path / "out")
    assert "a test's failure" in str(e.value.__context__) and not list(tmp_path.glob(".out*"))


def test_an_interrupted_lock_is_not_kept(tmp_path, monkeypatch):
    """Ctrl-C after the lock was taken and before it was handed over kept its file open: the process itself was then
    refused as "another repack is writing this output"."""
    from mxrepack.repack import destination

    out = tmp_path / "out"
    real_write = os.write

    def interrupted(fd, data):
        raise KeyboardInterrupt

    monkeypatch.setattr(destination.os, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        destination.OutputLock(out).__enter__()
    monkeypatch.setattr(destination.os, "write", real_write)
    with destination.OutputLock(out):
        pass


def _sigint_soon():
    os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode


def test_interrupt_guard_modes_and_restoration():
    """Raise, defer (delivered as the block ends), drop; the handlers back as they were; a deferred signal at the end
    goes to the handler it would have met outside."""
    from mxrepack.repack.interrupts import InterruptGuard

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with pytest.raises(KeyboardInterrupt), InterruptGuard():
        os.kill(os.getpid(), signal.SIGTERM)  # unwinds like Ctrl-C
        [None for _ in range(1000)]
    assert {sig: signal.getsignal(sig) for sig in before} == before
    steps = []
    with pytest.raises(KeyboardInterrupt), InterruptGuard() as guard:
        with guard.deferred():
            _sigint_soon()
            [None for _ in range(1000)]
            steps.append("rest of the block ran")
        steps.append("not reached")
    assert steps == ["rest of the block ran"]
    with InterruptGuard() as guard:
        try:
            raise KeyboardInterrupt  # an unwinding under way: what it drops
        except KeyboardInterrupt:
            guard.mode = "drop"
            _sigint_soon()
            [None for _ in range(1000)]
            steps.append("dropped")
        with pytest.raises(KeyboardInterrupt):  # none under way (one swallowed in a finalizer): acted on again
            _sigint_soon()
            [None for _ in range(1000)]
    assert steps[-1] == "dropped" and {sig: signal.getsignal(sig) for sig in before} == before
    calls = []
    try:  # a user's own handler is called, not replaced by an unwinding
        signal.signal(signal.SIGTERM, lambda *_: calls.append("theirs"))
        with InterruptGuard():
            os.kill(os.getpid(), signal.SIGTERM)
            [None for _ in range(1000)]
            steps.append("went on")
    finally:
        signal.signal(signal.SIGTERM, before[signal.SIGTERM])
    assert calls == ["theirs"] and steps[-1] == "went on"
    with pytest.raises(KeyboardInterrupt):
        with InterruptGuard() as guard:
            guard.mode = "defer"
            _sigint_soon()
            [None for _ in range(1000)]
        [None for _ in range(1000)]  # delivered to Python's own handler after the restoration
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_interrupt_guard_against_the_users_own_handlers():
    """A deferred SIGTERM whose action is the default unwinds rather than killing the process with no word; a signal
    that comes while the user's own handler runs is acted on after it (it was dropped); a handler of the user's that
    raises at the restoration still leaves every handler put back."""
    from mxrepack.repack.interrupts import InterruptGuard

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with pytest.raises(KeyboardInterrupt), InterruptGuard() as guard:
            guard.mode = "defer"
            os.kill(os.getpid(), signal.SIGTERM)
            [None for _ in range(1000)]
        log = []

        def theirs(signum, frame):
            log.append(signum)
            _sigint_soon()  # a Ctrl-C while their handler runs
            [None for _ in range(1000)]

        signal.signal(signal.SIGTERM, theirs)
        with pytest.raises(KeyboardInterrupt), InterruptGuard():
            os.kill(os.getpid(), signal.SIGTERM)
            [None for _ in range(1000)]
        assert log == [signal.SIGTERM]

        def leaving(signum, frame):
            raise SystemExit(143)

        signal.signal(signal.SIGTERM, leaving)
        with pytest.raises(SystemExit), InterruptGuard() as guard:
            guard.mode = "defer"
            os.kill(os.getpid(), signal.SIGTERM)
            [None for _ in range(1000)]
        assert signal.getsignal(signal.SIGTERM) is leaving
        assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_lock_left_without_its_exit_is_released_with_it(tmp_path):
    """An interrupt before OutputLock.__exit__ ran kept the lock for the process's life: a later conversion to the
    same output in that process was refused as another repack's."""
    import gc

    from mxrepack.repack.destination import OutputLock

    OutputLock(tmp_path / "out").__enter__()  # never exited
    gc.collect()
    with OutputLock(tmp_path / "out"):
        pass


def test_interrupt_guard_leaves_ignored_and_default_handlers(monkeypatch):
    from mxrepack.repack.interrupts import InterruptGuard

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C kills, as the user set it
        with InterruptGuard():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
            assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_ctrl_c_after_the_interrupt_was_reported_exits_quietly():
    """Pressed once more while the interpreter shut down (torch's finalizers), Ctrl-C printed a traceback under the
    one-line error."""
    code = (
        "import os, signal, time\n"
        "from mxrepack.cli import _exit_on_next_interrupt\n"
        "_exit_on_next_interrupt(True)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(5)\n"
        "print('not reached')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130 and proc.stdout == "" and proc.stderr == ""


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_experts_per_tok": 5}, "num_experts_per_tok is 5, expected an integer from 1 to num_local_experts (4)"),
        ({"num_experts_per_tok": "4"}, "num_experts_per_tok is '4', expected an integer"),
        ({"experts_per_token": 0}, "experts_per_token is 0, expected an integer from 1"),
        ({"layer_types": ["full_attention"]}, "layer_types is a list of 1, expected a list of num_hidden_layers (2)"),
        (
            {"layer_types": ["sliding_attention", "global"]},
            "layer_types[1] is 'global', expected a list of num_hidden_layers (2) entries",
        ),
        ({"layer_types": "alternating"}, "layer_types is 'alternating', expected a list"),
        ({"sliding_window": "128"}, "sliding_window is '128', expected a positive integer"),
        ({"sliding_window": None}, "sliding_window is None, expected a positive integer"),
    ],
    ids=[
        "topk-above-experts",
        "topk-string",
        "original-topk-zero",
        "short-layer-types",
        "unknown-layer-type",
        "layer-types-string",
        "window-string",
        "window-null",
    ],
)
def test_config_fields_an_engine_reads_are_checked_before_the_conversion(tiny, copy_of, tmp_path, change, message):
    """A top-k above the experts, a short layer_types or a string sliding_window converted and were copied into the
    output, where the serving engine refused them only at load."""
    src = copy_of(tiny)
    config = json.loads((src / "config.json").read_text())
    config.update(change)
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(MxRepackError, match=re.escape(message)):
        repack(str(src), "mxfp4", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_all_full_attention_layers_need_no_window(tiny, copy_of, tmp_path):
    src = copy_of(tiny)
    config = json.loads((src / "config.json").read_text())
    config.update(layer_types=["full_attention"] * config["num_hidden_layers"], sliding_window=None)
    (src / "config.json").write_text(json.dumps(config))
    assert repack(str(src), "mxfp4", tmp_path / "out")


def test_f32_expert_biases_are_refused_by_every_target_but_read_as_a_source(tiny, copy_of, tmp_path):
    """F32 expert biases BF16 cannot hold: every expert layout stores BF16 biases (bf16's too: it wrote the whole
    output and then failed verification), so the conversion refuses them up front; reading the checkpoint is fine."""
    from safetensors.torch import load_file, save_file

    from mxrepack.repack.source import open_checkpoint

    src = copy_of(tiny)
    tensors = load_file(_shard(src))
    for name in [n for n in tensors if ".mlp.experts." in n and n.endswith("_bias")]:
        tensors[name] = tensors[name].float() + 1e-4  # not a BF16 value
    save_file(tensors, _shard(src), metadata={"format": "pt"})
    assert open_checkpoint(str(src)).tensors["model.layers.0.mlp.experts.down_proj_bias"].dtype == torch.float32
    for target in ("bf16", "sm90"):
        with pytest.raises(MxRepackError, match=f"dtype F32, expected BF16 for target '{target}'"):
            repack(str(src), target, tmp_path / target)
        assert not (tmp_path / target).exists()


def test_a_conversion_off_the_main_thread_returns(tiny, tmp_path):
    """Signals can be set only from the main thread: the removal of the temporary folder skipped them, then set them
    back all the same, and a finished conversion raised ValueError."""
    import threading

    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(r=repack(str(tiny), "mxfp4", tmp_path / "out")))
    thread.start()
    thread.join()
    assert result["r"].verify["ok"] and not list(tmp_path.glob(".out.*"))


def test_result_path_under_a_file_is_refused_before_the_work(tmp_path):
    from mxrepack.eval.results import check_result_path, write_json

    (tmp_path / "afile").write_text("x")
    with pytest.raises(MxRepackError, match="afile is a file, not a folder; expected a file path for the result"):
        check_result_path(tmp_path / "afile" / "sub" / "r.json")
    with pytest.raises(MxRepackError, match="is a file, not a folder"):
        write_json(tmp_path / "afile" / "r.json", {})


def test_original_config_fields_are_named_as_that_file_names_them(tiny_original, copy_of, tmp_path):
    src = copy_of(tiny_original)
    path = src / "original" / "config.json" if (src / "original").is_dir() else src / "config.json"
    config = json.loads(path.read_text())
    config["experts_per_token"] = 0
    path.write_text(json.dumps(config))
    with pytest.raises(
        MxRepackError, match=re.escape("experts_per_token is 0, expected an integer from 1 to num_experts (4)")
    ):
        repack(str(src), "mxfp4", tmp_path / "out")


def test_null_layer_types_is_the_default(tiny, copy_of, tmp_path):
    src = copy_of(tiny)
    config = json.loads((src / "config.json").read_text())
    config["layer_types"] = None  # transformers' default: sliding and full layers alternating
    (src / "config.json").write_text(json.dumps(config))
    assert repack(str(src), "mxfp4", tmp_path / "out")


def test_a_failed_result_write_names_the_path_given(tmp_path):
    from mxrepack.eval.results import write_atomic

    def no_space(tmp):
        raise OSError(28, "No space left on device", str(tmp))

    with pytest.raises(MxRepackError, match=re.escape(f"{tmp_path / 'r.json'}: cannot write the result (No space")):
        write_atomic(tmp_path / "r.json", no_space)
    assert list(tmp_path.iterdir()) == []
