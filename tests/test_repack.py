"""End to end: repack the tiny fixture, the manifest, verify, atomicity, and every bad input."""

import copy
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mxrepack.errors import MxRepackError
from mxrepack.gptoss import EXPERT_PARTS
from mxrepack.layouts import LAYOUTS, dense_weights, get_layout
from mxrepack.recipes import builtin_names, load_recipe
from mxrepack.repack.output import read_manifest, read_weight_map
from mxrepack.repack.pipeline import repack
from mxrepack.repack.safetensors_io import read_directory
from mxrepack.repack.source import open_checkpoint
from mxrepack.repack.verify import verify_dir

TARGETS = builtin_names()  # every built-in target


@pytest.mark.parametrize("target", TARGETS)
def test_repack_writes_sharded_verified_output(tiny, tmp_path, target):
    recipe = load_recipe(target)
    mode, layout = recipe.quantization_config, get_layout(recipe.expert_layout).name
    out = tmp_path / "out"
    result = repack(str(tiny), target, out, shard_bytes=400_000)
    assert result.files > 3 and result.verify["ok"] and result.verify["source_checked"]
    names = sorted(os.listdir(out))
    assert "mxrepack.json" in names and "config.json" in names and "model.safetensors.index.json" in names
    assert "generation_config.json" in names and "chat_template.jinja" in names
    shards = [n for n in names if n.endswith(".safetensors")]
    assert len(shards) >= 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    manifest = json.loads((out / "mxrepack.json").read_text())
    assert manifest["target"]["name"] == target and manifest["tool"]["mxrepack"]
    assert set(manifest["source"]["files"]) >= {"config.json", "model-00000-of-00000.safetensors"}
    assert all(len(f["sha256"]) == 64 for f in manifest["files"].values())
    view = read_manifest(out)  # the typed view reads what the pipeline wrote
    assert view.data == manifest and view.recipe.data == recipe.data and view.target_name == target
    assert read_weight_map(out) == {name: entry["file"] for name, entry in view.tensors.items()}
    suffix = {
        "bf16": "gate_up_proj",
        "mxfp4": "gate_up_proj_blocks",
        "compressed-tensors": "0.gate_proj.weight_packed",
    }.get(layout, "w13_weight")
    entry = manifest["tensors"]["model.layers.1.mlp.experts." + suffix]
    assert entry["layout"] == manifest["target"]["recipe"]["experts"]["layout"] and entry["file"] in shards
    config = json.loads((out / "config.json").read_text())
    quant = config.get("quantization_config")
    if mode == "remove":
        assert quant is None
    elif mode == "native":
        assert quant["quant_method"] == "mxfp4"
    elif mode == "compressed-tensors":  # the padded intermediate units are real (inert) units of the written model
        assert quant["quant_method"] == "compressed-tensors" and config["intermediate_size"] == 256
        assert entry["padding"] == {"intermediate": [160, 256]} and entry["stored_shape"] == [256, 144]
    else:  # kernel layouts must not be mistaken for the native format by a stock engine
        assert mode == "mxrepack", mode
        dense = [recipe.dense_layout.name] if recipe.dense_layout else []  # sm12x recipes quantize q/k/v/o/lm_head
        assert quant["quant_method"] == "mxrepack" and quant["target"] == target
        assert quant["layouts"] == sorted([layout, "passthrough", *dense])
        assert quant["groups"]["experts"]["layout"] == layout
        assert quant["groups"]["experts"]["stored"]["w13_weight"]["logical_shape"][0] == 4
        padding = {
            "marlin": {"hidden": [288, 512], "intermediate": [160, 256]},
            "trtllm": {"hidden": [288, 512], "intermediate": [160, 256]},
            "flashinfer-cutlass": {"hidden": [288, 384], "intermediate": [160, 256]},
            "strided": {"hidden": [288, 384], "intermediate": [160, 256]},
        }
        if layout in padding:
            assert entry["padding"] == padding[layout]
        assert (
            entry["stored_shape"]
            == {
                "marlin": [4, 32, 1024],
                "trtllm": [4, 512, 256],
                "flashinfer-cutlass": [4, 512, 192],
                "strided": [4, 512, 192],
                "triton-hopper": [4, 80, 640],
            }[layout]
        )
    assert verify_dir(out)["ok"]


def test_bf16_values_and_original_layout_agree(tiny, tiny_original, tmp_path):
    a = read_directory(repack(str(tiny), "bf16", tmp_path / "a").out)
    b = read_directory(repack(str(tiny_original), "bf16", tmp_path / "b").out)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)  # original/ fused qkv splits to the same q/k/v
    ck = open_checkpoint(str(tiny))
    p = "model.layers.0.mlp.experts."
    src = dense_weights({k: ck.tensors[p + k].read() for k in EXPERT_PARTS})
    assert torch.equal(a[p + "gate_up_proj"].float(), src["gate_up_proj"].transpose(1, 2))
    assert a[p + "gate_up_proj"].shape == (4, 288, 320) and a[p + "down_proj"].shape == (4, 160, 288)


@pytest.mark.parametrize("kernel_copy", [True, False], ids=["copy_file_range", "read-write-fallback"])
def test_mxfp4_target_is_byte_identical(tiny, tmp_path, monkeypatch, kernel_copy):
    """Tensors stored unchanged are copied by the kernel, or read and written where it cannot (EXDEV)."""
    if not kernel_copy:

        def cannot(*args):
            raise OSError(18, "Invalid cross-device link")  # EXDEV

        monkeypatch.setattr(os, "copy_file_range", cannot)
    ck = open_checkpoint(str(tiny))
    result = repack(str(tiny), "mxfp4", tmp_path / "o")
    out = read_directory(result.out)
    assert out.keys() == ck.tensors.keys()
    assert all(torch.equal(out[k].view(torch.uint8), ck.tensors[k].read().view(torch.uint8)) for k in out)
    assert verify_dir(result.out)["ok"]  # the manifest's sha256 (hashed behind the writer) match the files


def test_layout_roundtrips_on_tiny(tiny):
    from mxrepack.layouts import ExpertDims

    ck = open_checkpoint(str(tiny))
    p = "model.layers.1.mlp.experts."
    parts = {k: ck.tensors[p + k].read() for k in EXPERT_PARTS}
    dims = ExpertDims(4, 288, 160)
    for layout in LAYOUTS.values():
        if layout.per_expert:  # one tensor per expert: pack each, stack for unpack
            stored = {
                o.suffix: torch.stack([o.pack(**{k: parts[k][e : e + 1] for k in o.inputs}) for e in range(4)])
                for o in layout.outputs(dims)
            }
            shapes = {o.suffix: (4, *o.shape) for o in layout.outputs(dims)}
        else:
            stored = {o.suffix: o.pack(**{k: parts[k] for k in o.inputs}) for o in layout.outputs(dims)}
            shapes = {o.suffix: o.shape for o in layout.outputs(dims)}
        for o in layout.outputs(dims):
            assert tuple(stored[o.suffix].shape) == shapes[o.suffix] and stored[o.suffix].dtype == o.dtype
        back = layout.unpack(stored, dims)
        if layout.exact_bytes:
            assert all(torch.equal(back[k], parts[k]) for k in parts)
        else:
            want, have = dense_weights(parts), dense_weights(back)
            assert all(torch.equal(want[k], have[k]) for k in want)


def test_existing_output_is_refused_then_replaced_with_overwrite(tiny, tmp_path):
    out = tmp_path / "out"
    repack(str(tiny), "bf16", out)
    with pytest.raises(MxRepackError, match="already exists; pass --overwrite"):
        repack(str(tiny), "mxfp4", out)
    later = (out / "mxrepack.json").stat().st_mtime_ns + 10**9  # as a copy that did not keep file times leaves it
    for f in out.iterdir():
        if f.name != "mxrepack.json":
            os.utime(f, ns=(later, later))
    repack(str(tiny), "mxfp4", out, overwrite=True)
    assert json.loads((out / "mxrepack.json").read_text())["target"]["name"] == "mxfp4"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary siblings or lock left


def _tree(path: Path) -> dict:
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*"))}


@pytest.mark.parametrize(
    "where",
    [
        "source",
        "source parent",
        "inside source",
        "plain folder",
        "output with a user file",
        "output with an edited file",
        "output edited in place",
        "output with an edited manifest",
    ],
)
def test_overwrite_never_deletes_what_mxrepack_did_not_write(tiny, tmp_path, copy_of, where):
    """--overwrite replaces only an mxrepack output holding nothing else, and never the source or what holds it."""
    src = copy_of(tiny)
    (tmp_path / "notes.txt").write_text("the user's")
    out = {
        "source": src,
        "source parent": tmp_path,
        "inside source": src / "sub",
        "plain folder": tmp_path / "mine",
    }.get(where, tmp_path / "out")
    if where == "plain folder":
        out.mkdir()
        (out / "keep.txt").write_text("x")
    if where.startswith("output with") or where == "output edited in place":
        out = tmp_path / "out"
        repack(str(src), "bf16", out)
    if where == "output with a user file":
        (out / "my-eval.json").write_text("{}")
    if where == "output with an edited file":  # the user's own generation settings: theirs to keep
        (out / "generation_config.json").write_text('{"temperature": 0.7, "top_p": 0.95, "mine": true}')
    if where == "output edited in place":  # same size, later time
        shard = next(out.glob("*.safetensors"))
        data = bytearray(shard.read_bytes())
        data[-1] ^= 1
        shard.write_bytes(bytes(data))
        os.utime(shard, ns=((out / "mxrepack.json").stat().st_mtime_ns + 10**9,) * 2)  # whatever the clock's grain
    if where == "output with an edited manifest":
        m = json.loads((out / "mxrepack.json").read_text())
        m["target"]["name"] = "renamed"
        (out / "mxrepack.json").write_text(json.dumps(m))
    before = _tree(tmp_path)
    message = {
        "source": "is the source checkpoint",
        "source parent": "contains the source checkpoint",
        "inside source": "lies inside the source checkpoint",
        "plain folder": "holds no readable mxrepack.json",
        "output with a user file": "holds 'my-eval.json', which its manifest does not list",
        "output with an edited file": "'generation_config.json' is .* bytes where its manifest says",
        "output edited in place": "was modified after mxrepack wrote this output",
        "output with an edited manifest": "its manifest was edited since mxrepack wrote it",
    }[where]
    with pytest.raises(MxRepackError, match=message) as e:
        repack(str(src), "bf16", out, overwrite=True)
    assert "\n" not in str(e.value) and str(out) in str(e.value)
    assert _tree(tmp_path) == before  # nothing touched, no lock or temporary left


def test_hub_cache_blobs_count_as_the_source(tmp_path, tiny):
    """A Hub-cache source is its snapshot and the blobs its links resolve to: neither may be an output."""
    repo = tmp_path / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in tiny.iterdir():
        (blobs / f.name).write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(Path("../../blobs") / f.name)
    for out in (blobs, repo):
        with pytest.raises(MxRepackError, match="source checkpoint"):
            repack(str(snap), "bf16", out, overwrite=True)
    assert sorted(p.name for p in blobs.iterdir()) == sorted(p.name for p in tiny.iterdir())


def test_a_second_conversion_to_the_same_output_fails_and_leaves_the_first(tiny, tmp_path):
    from mxrepack.repack.destination import OutputLock

    out = tmp_path / "out"
    repack(str(tiny), "bf16", out)
    before = _tree(out)
    with OutputLock(out.absolute()):  # another conversion in progress
        with pytest.raises(MxRepackError, match=f"another repack is writing this output \\(process {os.getpid()}\\)"):
            repack(str(tiny), "mxfp4", out, overwrite=True)
        with pytest.raises(MxRepackError, match="another repack is writing"):
            repack(str(tiny), "mxfp4", tmp_path / "out")
    assert _tree(out) == before
    repack(str(tiny), "mxfp4", out, overwrite=True)  # the lock is released with its holder


def test_two_processes_racing_for_one_output(tiny, tmp_path):
    """Two real conversions started together: exactly one writes the output, the other fails in one line."""
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "mxrepack.cli",
        str(tiny),
        "--target",
        "bf16",
        "--out",
        str(out),
        "--no-source-hash",
        "--json",
    ]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 1], results
    err = next(e for rc, e in results if rc == 1).strip()
    assert len(err.splitlines()) == 1 and ("another repack is writing" in err or "already exists" in err)
    assert verify_dir(out)["ok"]


def test_unwritable_output_place_is_one_line(tiny, tmp_path, monkeypatch):
    """A read-only place (a read-only mount; root ignores permission bits, so the OS error is injected)."""
    import errno

    import mxrepack.repack.destination as destination

    real_open = os.open

    def read_only(path, *args, **kwargs):
        if str(path).endswith(".mxrepack-lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(destination.os, "open", read_only)
    with pytest.raises(MxRepackError, match="cannot write the output here \\(Read-only file system\\)"):
        repack(str(tiny), "bf16", tmp_path / "out")
    monkeypatch.undo()

    def no_mkdir(self, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "mkdir", no_mkdir)
    with pytest.raises(MxRepackError, match="cannot write the output here"):
        repack(str(tiny), "bf16", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_make_fixture_overwrite_replaces_only_a_fixture(tmp_path):
    from mxrepack.repack.fixture import make_fixture

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("x")
    with pytest.raises(MxRepackError, match="only replaces a fixture"):
        make_fixture(mine, "tiny", overwrite=True)
    assert (mine / "thesis.tex").exists()
    fx = make_fixture(tmp_path / "fx", "tiny", seed=1)
    make_fixture(fx, "tiny", seed=2, overwrite=True)
    (fx / "notes").write_text("x")
    with pytest.raises(MxRepackError, match="holds 'notes'"):
        make_fixture(fx, "tiny", overwrite=True)
    (fx / "notes").unlink()
    # an edit of make-fixture's own files is the user's to keep: another size, or the same size written later
    config = (fx / "config.json").read_text()
    (fx / "config.json").write_text(config + " ")
    with pytest.raises(MxRepackError, match="'config.json' was changed after make-fixture wrote it"):
        make_fixture(fx, "tiny", overwrite=True)
    (fx / "config.json").write_text(config)  # its size again, but newer than the mark
    mark_time = (fx / "mxrepack-fixture.json").stat().st_mtime_ns
    os.utime(fx / "config.json", ns=(mark_time + 10**9, mark_time + 10**9))
    with pytest.raises(MxRepackError, match="'config.json' was changed"):
        make_fixture(fx, "tiny", overwrite=True)
    assert (fx / "config.json").read_text() == config  # nothing replaced
    os.utime(fx / "config.json", ns=(mark_time, mark_time))  # as make-fixture left it: replaced
    make_fixture(fx, "tiny", seed=3, overwrite=True)


def test_user_recipe_file_and_recipe_errors(tiny, tmp_path):
    good = tmp_path / "mine.yaml"
    good.write_text(
        "name: mine\ndescription: d\nexperts: {layout: mxfp4}\ndense: {format: bf16}\n"
        "config: {quantization_config: native}\n"
    )
    assert repack(str(tiny), None, tmp_path / "o", recipe_file=str(good)).target == "mine"
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: b\ndescription: d\nexperts: {layout: nope}\ndense: {format: bf16}\n"
        "config: {quantization_config: remove}\n"
    )
    valid = re.escape(", ".join(sorted(LAYOUTS)))
    with pytest.raises(MxRepackError, match=rf"key 'experts.layout': unknown value 'nope' \(valid: {valid}\)"):
        repack(str(tiny), None, tmp_path / "o2", recipe_file=str(bad))
    bad.write_text("name: b\ndescription: d\nexperts: {layout: bf16, colour: red}\n")
    with pytest.raises(MxRepackError, match="key 'experts.colour' is not known"):
        repack(str(tiny), None, tmp_path / "o2", recipe_file=str(bad))
    bad.write_text(
        "name: b\ndescription: d\nexperts: {layout: marlin, options: {tile: 3}}\ndense: {format: bf16}\n"
        "config: {quantization_config: mxrepack}\n"
    )
    with pytest.raises(MxRepackError, match="key 'experts.options': .*not accepted by layout 'marlin'"):
        repack(str(tiny), None, tmp_path / "o2", recipe_file=str(bad))
    assert not (tmp_path / "o2").exists()


def test_dense_order_belongs_to_mxfp4():
    """The dense byte order (a recipe's dense.order) is MXFP4's: sm90-strided keeps it with BF16 dense for --dense
    mxfp4, drops it for --dense mxfp8, and a recipe asking mxfp8 in a chunk order is refused in one line."""
    from mxrepack.recipes import Recipe, _check, load_recipe

    recipe = load_recipe("sm90-strided")
    assert recipe.dense_order == "rows" and recipe.data["dense"]["order"] == "wgmma"  # BF16 dense: no byte order
    assert recipe.with_overrides(dense="mxfp4").dense_order == "wgmma"
    mxfp8 = recipe.with_overrides(dense="mxfp8")
    assert mxfp8.dense_order == "rows" and "order" not in mxfp8.data["dense"]
    data = copy.deepcopy(recipe.data)
    data["dense"].update(format="mxfp8")
    with pytest.raises(MxRepackError, match=r"dense.order wgmma is a byte order of MXFP4's, not of mxfp8"):
        _check(data, "x.yaml")
    # a manifest written before the refusal (sm90-strided --dense mxfp8 kept wgmma) still gives its layout
    written = Recipe("sm90-strided", data, "manifest")
    assert written.dense_layout.format == "mxfp8" and not written.dense_layout.chunked


# --- bad input: one-line error naming the file/tensor, and nothing left at the output path -------


def _damage_header(path: Path, name: str, **changes) -> None:
    """Rewrite one tensor's header entry (keeping the data) to fake a malformed checkpoint."""
    import struct

    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header[name].update(changes)
    new = json.dumps(header, separators=(",", ":")).encode()
    new += b" " * (n - len(new)) if len(new) <= n else b""
    assert len(new) == n, "header grew; pick a change that keeps its size"
    path.write_bytes(raw[:8] + new + raw[8 + n :])


def _shard(d: Path) -> Path:
    return d / "model-00000-of-00000.safetensors"


BLOCKS = "model.layers.1.mlp.experts.down_proj_blocks"
SCALES = "model.layers.1.mlp.experts.down_proj_scales"


def _bad_missing_path(d):
    return str(d) + "-nope", "path does not exist"


def _bad_config(d):
    c = json.loads((d / "config.json").read_text())
    c["model_type"] = "llama"
    (d / "config.json").write_text(json.dumps(c))
    return str(d), "model_type is 'llama', expected 'gpt_oss'"


def _bad_config_size(d):
    c = json.loads((d / "config.json").read_text())
    c["intermediate_size"] = str(c["intermediate_size"])  # a hand-edited config
    (d / "config.json").write_text(json.dumps(c))
    return str(d), f"config.json: intermediate_size is '{c['intermediate_size']}', expected a positive integer"


def _bad_missing_shard(d):
    _shard(d).unlink()
    return str(d), "model-00000-of-00000.safetensors: shard listed in model.safetensors.index.json is missing"


def _bad_truncated(d):
    data = _shard(d).read_bytes()
    _shard(d).write_bytes(data[: len(data) - 1000])
    return str(d), "truncated: tensor"


def _bad_corrupt_header(d):
    data = bytearray(_shard(d).read_bytes())
    data[20:30] = b"\xff" * 10
    _shard(d).write_bytes(bytes(data))
    return str(d), "corrupted safetensors header"


def _bad_scales_shape(d):
    _damage_header(_shard(d), SCALES, shape=[4, 5, 288])  # same bytes, wrong shape
    return str(d), f"tensor '{SCALES}': scales shape [4, 5, 288] != blocks shape[:-1] [4, 288, 5]"


def _bad_dtype(d):
    _damage_header(_shard(d), SCALES, dtype="I8")
    return str(d), f"tensor '{SCALES}': dtype I8, expected U8"


def _bad_e8m0_nan(d):
    from mxrepack.repack.safetensors_io import read_header

    info = read_header(_shard(d))[0][SCALES]
    with open(_shard(d), "r+b") as f:
        f.seek(info.start + 7)
        f.write(b"\xff")
    return str(d), f"tensor '{SCALES}': 1 E8M0 scale byte(s) are 255 (NaN)"


def _bad_stale_file(d):
    # no index, and a stray file holding a weight's name (a partial download; recorded activations use these names):
    # which copy to read is not known, so neither is read
    from safetensors.torch import load_file, save_file

    (d / "model.safetensors.index.json").unlink()
    save_file({"model.norm.weight": load_file(_shard(d))["model.norm.weight"] * 7}, d / "zz-stale.safetensors")
    return str(d), "zz-stale.safetensors: tensor 'model.norm.weight' is also in model-00000-of-00000.safetensors"


BAD_INPUTS = [
    _bad_missing_path,
    _bad_stale_file,
    _bad_config,
    _bad_config_size,
    _bad_missing_shard,
    _bad_truncated,
    _bad_corrupt_header,
    _bad_scales_shape,
    _bad_dtype,
    _bad_e8m0_nan,
]


@pytest.mark.parametrize("damage", BAD_INPUTS, ids=lambda f: f.__name__[5:])
def test_bad_input_one_line_error_and_no_output(tiny, copy_of, tmp_path, damage, refused_in_one_line):
    source, message = damage(copy_of(tiny))
    assert message in refused_in_one_line(source, tmp_path / "out", "bf16")


def test_unknown_target_lists_valid_ones(tiny, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mxrepack.cli", str(tiny), "--target", "sm999", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: unknown target 'sm999'; valid targets: {', '.join(sorted(TARGETS))}"


def _poison(src: Path, name: str, row: int, col: int, bits: bytes) -> None:
    """Overwrite one BF16 value of tensor ``name`` in the source's shard with ``bits`` (little-endian)."""
    from mxrepack.repack.safetensors_io import read_header

    info = read_header(_shard(src))[0][name]
    with open(_shard(src), "r+b") as f:
        f.seek(info.start + row * info.row_bytes + col * 2)
        f.write(bits)


NAN, INF = b"\xc0\x7f", b"\x80\x7f"  # BF16 0x7FC0, 0x7F80


@pytest.mark.parametrize(
    "target,name,row,cols,how",
    [
        ("mxfp4", "model.layers.1.mlp.router.weight", 2, (5, 7), "copied by the kernel"),
        ("sm121", "model.layers.0.mlp.router.bias", 1, (0, 2), "copied by the kernel (1-D: a row is an element)"),
        ("bf16", "model.embed_tokens.weight", 300, (5, 7), "copied by the kernel"),
        ("sm121-marlin", "model.layers.1.mlp.experts.down_proj_bias", 1, (5, 7), "permuted by the layout"),
        ("bf16", "model.layers.0.mlp.experts.gate_up_proj_bias", 3, (5, 7), "read beside the dequantized experts"),
    ],
)
def test_nonfinite_in_a_tensor_stored_unquantized(tiny, copy_of, tmp_path, target, name, row, cols, how):
    """NaN/Inf that a conversion would write unchanged: a one-line error naming file, tensor and row; with
    allow_nonfinite a warning, the manifest's record and the card's note."""
    src = copy_of(tiny)
    _poison(src, name, row, cols[0], NAN)
    _poison(src, name, row, cols[1], INF)
    with pytest.raises(MxRepackError) as e:
        repack(str(src), target, tmp_path / "out")
    assert str(e.value) == (
        f"{_shard(src)}: tensor '{name}': 2 NaN/Inf value(s) (first in row {row}); the output would "
        "carry them unchanged (pass --allow-nonfinite to write them anyway)"
    )
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
    result = repack(str(src), target, tmp_path / "out", allow_nonfinite=True)
    assert result.warnings == [
        f"{_shard(src)}: tensor '{name}': 2 NaN/Inf value(s) (first in row {row}) written unchanged (--allow-nonfinite)"
    ]
    manifest = json.loads((result.out / "mxrepack.json").read_text())
    assert manifest["nonfinite"] == {name: {"file": str(_shard(src)), "count": 2, "first_row": row}}
    assert verify_dir(result.out)["ok"]
    from mxrepack.hub import render_card

    assert (
        f"**Warning:** the source held NaN/Inf values, written here unchanged (`--allow-nonfinite`): `{name}` (2)"
        in render_card(manifest, "me/x")
    )


def test_nonfinite_cli_flag_and_the_quantized_path_still_refuses(tiny, copy_of, tmp_path):
    src = copy_of(tiny)
    _poison(src, "model.layers.0.mlp.router.weight", 0, 0, NAN)
    cmd = [sys.executable, "-m", "mxrepack.cli", str(src), "--target", "mxfp4", "--out", str(tmp_path / "o")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "--allow-nonfinite" in proc.stderr
    proc = subprocess.run([*cmd, "--allow-nonfinite"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("warning: ") and "model.layers.0.mlp.router.weight': 1 NaN/Inf" in proc.stderr
    # a dense layer the target quantizes refuses NaN itself, flag or not (mxfp4 codes cannot hold it)
    _poison(src, "model.layers.0.self_attn.q_proj.weight", 4, 0, INF)
    with pytest.raises(
        MxRepackError, match="q_proj.weight': 1 NaN/Inf value\\(s\\) \\(first in row 4 of this chunk\\); refusing"
    ):
        repack(str(src), "sm121", tmp_path / "q", allow_nonfinite=True)


@pytest.mark.parametrize("size", ["0", "-5GB", "0.1B", "inf", "nan", "5XB", "abc"])
def test_shard_size_must_be_a_positive_size(tiny, tmp_path, size, capsys):
    from mxrepack.cli import main

    assert main([str(tiny), "--target", "bf16", "--out", str(tmp_path / "o"), "--shard-size", size]) == 1
    err = capsys.readouterr().err
    assert err == f"error: --shard-size {size!r}: expected a positive size like 5GB, 500MB or 2GiB\n"
    assert not (tmp_path / "o").exists()
    with pytest.raises(MxRepackError, match="shard size 0: expected a positive number of bytes"):
        repack(str(tiny), "bf16", tmp_path / "o", shard_bytes=0)


def test_recipe_and_target_together_is_an_error(tiny, tmp_path, capsys):
    from mxrepack.cli import main
    from mxrepack.recipes import load_recipe

    recipe = tmp_path / "mine.yaml"
    recipe.write_text(
        "name: mine\ndescription: d\nexperts: {layout: mxfp4}\ndense: {format: bf16}\n"
        "config: {quantization_config: native}\n"
    )
    assert main([str(tiny), "--target", "sm121", "--recipe", str(recipe), "--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err == (
        f"error: --target sm121 and --recipe {recipe}: pass one (the recipe file names its own target)\n"
    )
    with pytest.raises(MxRepackError, match="pass one"):
        load_recipe("sm121", recipe)
    assert not (tmp_path / "o").exists()


def test_an_mxrepack_output_as_source_says_so(tiny, tmp_path):
    out = repack(str(tiny), "sm121", tmp_path / "sm121").out
    with pytest.raises(MxRepackError) as e:
        repack(str(out), "sm90", tmp_path / "again")
    assert str(e.value) == f"{out} is an mxrepack output (target sm121); repack from the original checkpoint ({tiny})"
    (out / "mxrepack.json").unlink()  # config.json's quant_method says it too
    with pytest.raises(
        MxRepackError,
        match=r"is an mxrepack output \(target sm121\) whose mxrepack.json is missing; repack from the original "
        r"checkpoint$",
    ):
        open_checkpoint(str(out))
    # the mxfp4 target keeps the native format: its output is a gpt-oss checkpoint like any other
    native = repack(str(tiny), "mxfp4", tmp_path / "mxfp4").out
    assert repack(str(native), "sm90", tmp_path / "from-native").verify["ok"]


def test_disk_full_during_write(tiny, tmp_path):
    out = tmp_path / "out"

    def limit():  # the file-size limit makes write() fail with EFBIG, like a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))

    proc = subprocess.run(
        [sys.executable, "-m", "mxrepack.cli", str(tiny), "--target", "bf16", "--out", str(out)],
        capture_output=True,
        text=True,
        preexec_fn=limit,
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "write failed" in proc.stderr and "is the disk full?" in proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _start_and_wait_for(src: Path, out: Path, pattern: str, signum: int) -> subprocess.Popen:
    """Start a conversion and send ``signum`` as soon as a file matching ``pattern`` appears."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mxrepack.cli", str(src), "--target", "bf16", "--out", str(out), "--shard-size", "2MB"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not list(out.parent.glob(pattern)) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signum)
    proc.wait()
    return proc


@pytest.mark.parametrize("moment", [".out.mxrepack-tmp-*", ".out.mxrepack-tmp-*/model-00002-*"])
def test_sigkill_leaves_nothing_at_output_path(tmp_path, moment):
    from mxrepack.repack.fixture import make_fixture

    src = make_fixture(tmp_path / "src", "tiny", layers=16, num_local_experts=64)
    out = tmp_path / "out"
    proc = _start_and_wait_for(src, out, moment, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    assert list(tmp_path.glob(".out.mxrepack-tmp-*"))  # the kill left its temporary sibling...
    result = repack(str(src), "mxfp4", out)  # ...which the next run removes
    assert result.verify["ok"] and not list(tmp_path.glob(".out.mxrepack-tmp-*"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP (a closed terminal)"])
def test_sigterm_cleans_up(tmp_path, sig):
    from mxrepack.repack.fixture import make_fixture

    src = make_fixture(tmp_path / "src", "tiny", layers=16, num_local_experts=64)
    out = tmp_path / "out"
    proc = _start_and_wait_for(src, out, ".out.mxrepack-tmp-*/model-00002-*", sig)
    assert proc.returncode != 0
    assert not out.exists() and not list(tmp_path.glob(".out.*"))


def test_shard_hash_is_the_files(tmp_path, monkeypatch):
    """The writer's sha256, mapped back behind it over written chunks and kernel-copied ranges alike, is the
    file's own hash (small windows, so that most start inside a page)."""
    import hashlib

    from mxrepack.repack import safetensors_io as sio

    monkeypatch.setattr(sio._FollowingHash, "WINDOW", 1000)
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(5000))
    tensors = [
        sio.PlannedTensor("a", torch.uint8, (40, 100)),
        sio.PlannedTensor("b", torch.uint8, (5000,)),
        sio.PlannedTensor("c", torch.int32, (300,)),
    ]
    writer = sio.StreamingShardWriter(tmp_path / "out.safetensors", tensors)
    for r0 in range(0, 40, 15):  # chunks of 1500, 1500, 1000 bytes
        writer.write("a", torch.randint(0, 256, (min(15, 40 - r0), 100), dtype=torch.uint8))
    writer.copy_from("b", src, 0, 5000)
    writer.write("c", torch.randint(-9, 9, (300,), dtype=torch.int32))
    writer.close()
    assert writer.sha256() == hashlib.sha256((tmp_path / "out.safetensors").read_bytes()).hexdigest()
    writer.wait_synced()


def test_shard_hash_failure_is_an_error(tmp_path, monkeypatch):
    """Any failure on the hashing thread, not only an I/O error, fails the shard: a digest of part of the file
    must never reach the manifest."""
    from mxrepack.repack import safetensors_io as sio

    def broken(*args):
        raise RuntimeError("no mapping")

    monkeypatch.setattr(sio, "map_range", broken)
    writer = sio.StreamingShardWriter(tmp_path / "out.safetensors", [sio.PlannedTensor("a", torch.uint8, (10,))])
    writer.write("a", torch.zeros(10, dtype=torch.uint8))
    writer.close()
    with pytest.raises(MxRepackError, match="out.safetensors.*sha256.*no mapping"):
        writer.sha256()
    writer.wait_synced()


@pytest.mark.parametrize("target", ["sm121", "bf16", "compressed-tensors"])
def test_progress_counts_the_output_bytes_it_writes(tiny, tmp_path, target):
    """The repack bar's total is what its updates add up to: the output's tensor bytes (the index's total_size). It
    was the source bytes each output reads: a dense weight quantized into values and scales counted twice (sm121),
    and neither size for a target that grows (bf16) or pads (compressed-tensors)."""
    calls = []
    out = repack(str(tiny), target, tmp_path / "out", progress=lambda done, total: calls.append((done, total))).out
    total_size = json.loads((out / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
    dones = [done for done, _ in calls]
    assert {total for _, total in calls} == {total_size}
    assert dones == sorted(dones) and dones[-1] == total_size


def test_verify_shows_progress_on_a_terminal_and_none_with_json(tiny, tmp_path, bars, capsys, monkeypatch):
    from mxrepack import progress
    from mxrepack.cli import main

    out = repack(str(tiny), "sm121", tmp_path / "out").out
    manifest = json.loads((out / "mxrepack.json").read_text())
    assert main(["verify", str(out)]) == 0
    (bar,) = bars
    totals = bar.totals()  # each phase counts to its total
    assert set(totals) == {"sha256 of output files", "source comparison (output bytes)", "sha256 of source files"}
    assert totals["sha256 of output files"] == sum(f["size"] for f in manifest["files"].values())
    assert totals["sha256 of source files"] == sum(f["size"] for f in manifest["source"]["files"].values())
    assert 0 < totals["source comparison (output bytes)"] < totals["sha256 of output files"]
    assert main(["verify", str(out), "--json"]) == 0 and not bars[1].enabled

    # The real bar (undo() puts it back), on a terminal: drawn on stderr; with --json nothing on stderr, only JSON
    # on stdout.
    monkeypatch.undo()
    monkeypatch.setattr(progress, "_stderr_is_terminal", lambda: True)
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0
    assert "verify: sha256 of output files" in capsys.readouterr().err
    assert main(["verify", str(out), "--json"]) == 0
    cap = capsys.readouterr()
    assert cap.err == "" and json.loads(cap.out)["ok"]


def test_an_ignored_hangup_stays_ignored(tiny, tmp_path, monkeypatch):
    # `nohup repack ...` ignores SIGHUP so that a long conversion outlives its terminal: it must not abort it
    from mxrepack.repack import pipeline

    write = pipeline._write_weights

    def hang_up_then_write(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGHUP)  # the terminal closes mid-conversion
        return write(*args, **kwargs)

    monkeypatch.setattr(pipeline, "_write_weights", hang_up_then_write)
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert repack(str(tiny), "bf16", tmp_path / "out").verify["ok"]
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)
