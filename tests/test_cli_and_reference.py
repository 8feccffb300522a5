"""The CLI's subcommands, verify catching tampering, and the torch reference GEMM."""

import json
import subprocess
import sys

import pytest
import torch

from mxrepack.cli import main
from mxrepack.eval import tensor_error
from mxrepack.gptoss import EXPERT_PARTS
from mxrepack.kernels.reference import expert_mlp, mxfp4_linear
from mxrepack.layouts import dense_weights
from mxrepack.repack.source import open_checkpoint


def run(*args):
    return subprocess.run([sys.executable, "-m", "mxrepack.cli", *map(str, args)], capture_output=True, text=True)


def test_targets_inspect_and_verify(tiny, tmp_path, capsys):
    assert main(["targets", "--json"]) == 0
    targets = {t["target"]: t for t in json.loads(capsys.readouterr().out)["targets"]}
    assert {"bf16", "mxfp4"} <= set(targets) and targets["bf16"]["consumer"]
    assert main(["inspect", str(tiny), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"].startswith("native gpt-oss MXFP4") and report["config"]["num_local_experts"] == 4
    assert report["components"]["experts"]["dtypes"] == ["BF16", "U8"]
    out = tmp_path / "out"
    assert main([str(tiny), "--target", "bf16", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["verify", str(out), "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["ok"] and v["source_checked"] and v["checksums"]
    assert main(["inspect", str(out)]) == 0
    assert "mxrepack target 'bf16'" in capsys.readouterr().out
    # an unfinished download: inspect describes the files present and says the index lists more
    shard = next(out.glob("model-*.safetensors"))
    shard.rename(tmp_path / shard.name)
    (out / "model-extra.safetensors").write_bytes((tmp_path / shard.name).read_bytes())  # so that some file is left
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"incomplete: the index lists 1 file(s) not here ({shard.name})" in text
    # a file the index does not list is named apart, not counted as part of the model
    assert "not in the index: 1 file(s) (model-extra.safetensors); a loader does not read them" in text
    assert "files: 0 safetensors" in text


@pytest.mark.parametrize(
    "args,rc,text",
    [
        (["-h"], 0, "Usage: repack"),
        (["--version"], 0, "mxrepack "),
        (["convert", "-h"], 0, "Usage: repack convert"),
        (["x", "--target"], 2, "Option '--target' requires an argument"),
        (["x", "--bogus"], 2, "No such option: --bogus"),
        (["kernels", "check", "--jobs", "abc"], 2, "Invalid value for '--jobs'"),
        (["kernels", "chek"], 2, "No such command 'chek'"),
        (["verfy", "out"], 2, "did you mean 'verify'"),
    ],
)
def test_usage_mistakes_are_short_messages_not_tracebacks(args, rc, text):
    p = run(*args)
    assert p.returncode == rc and "Traceback" not in p.stderr + p.stdout
    assert text in p.stdout + p.stderr
    if rc:
        assert len(p.stderr.strip().splitlines()) <= 4


def test_eval_mistakes_are_one_line(tmp_path, capsys):
    # a port out of range or taken, a window of no tokens, two models' vocabularies: one line each, exit 1
    import shutil
    import socket

    from mxrepack.eval.bundled import bundled_model
    from mxrepack.repack.fixture import make_fixture

    tiny = bundled_model()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    other = tmp_path / "other-vocab"  # another model's vocabulary, with a tokenizer so that it gets that far
    make_fixture(other, preset="tiny", vocab_size=512)
    shutil.copy(tiny / "tokenizer.json", other)
    for args, text in (
        (["eval", "serve", str(tiny), "--port", "80000"], "--port 80000: expected 0-65535"),
        (["eval", "serve", str(tiny), "--port", str(taken.getsockname()[1])], "cannot listen"),
        (["eval", "logits", str(tiny), str(tiny), "--ctx", "0"], "--ctx 0 / --max-tokens 4096: expected at least"),
        (["eval", "logits", str(tiny), str(other)], "vocabulary of 512 tokens, where the reference"),
    ):
        assert main(args) == 1, args
        err = capsys.readouterr().err.strip()
        assert text in err and len(err.splitlines()) == 1, err
    taken.close()


def test_verify_detects_tampering_and_missing_manifest(tiny, tmp_path):
    out = tmp_path / "out"
    assert run(tiny, "--target", "mxfp4", "--out", out).returncode == 0
    shard = sorted(out.glob("model-*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    proc = run("verify", out)
    assert proc.returncode == 1 and proc.stderr.startswith("error: verify failed:") and "sha256 differs" in proc.stderr
    (out / "mxrepack.json").unlink()
    proc = run("verify", out)
    assert proc.returncode == 1 and "no manifest" in proc.stderr and proc.stderr.count("\n") == 1


def test_verify_checks_the_manifest_itself_and_unlisted_files(tiny, tmp_path, capsys):
    """The manifest carries the sha256 of its own content: an edit fails verify in one line naming it; a file the
    manifest does not list fails it too; the Hub's own files (a download has them) do not."""
    out = tmp_path / "out"
    assert main([str(tiny), "--target", "bf16", "--out", str(out)]) == 0
    path = out / "mxrepack.json"
    original = path.read_text()
    manifest = json.loads(original)
    assert manifest["format_version"] == 2 and len(manifest["manifest_sha256"]) == 64
    (out / "README.md").write_text("card")
    (out / ".gitattributes").write_text("")
    (out / ".cache" / "huggingface").mkdir(parents=True)
    (out / ".cache" / "huggingface" / ".gitignore").write_text("*")
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0 and capsys.readouterr().err == ""

    (out / "weights-backup.safetensors").write_bytes(b"x")
    assert main(["verify", str(out), "--no-source"]) == 1
    assert capsys.readouterr().err == (
        f"error: verify failed: {out / 'weights-backup.safetensors'}: not listed in the "
        "manifest (mxrepack did not write it); move it out of the output\n"
    )
    (out / "weights-backup.safetensors").unlink()

    manifest["target"]["recipe"]["description"] = "something else"
    path.write_text(json.dumps(manifest, indent=2))
    assert main(["verify", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"error: verify failed: {path}: edited since mxrepack wrote it (its content no "
        "longer matches its manifest_sha256); re-run repack rather than edit the "
        "manifest\n"
    )
    # whitespace and key order are not content: a reformatted manifest still verifies
    path.write_text(json.dumps(json.loads(original), indent=None, sort_keys=True))
    assert main(["verify", str(out)]) == 0
    # a manifest from before the digest: verified with a warning (push refuses it: tests/test_hub.py)
    old = json.loads(original)
    del old["manifest_sha256"]
    old["format_version"] = 1
    path.write_text(json.dumps(old))
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"warning: {path}: format 1 has no manifest_sha256") and err.count("\n") == 1


def test_manifest_digest_is_of_what_json_reads_back(tmp_path):
    """Tuples and non-string keys (a recipe's YAML may have them) are digested as the written file reads back."""
    from mxrepack.repack.output import MANIFEST, check_manifest_digest, seal_manifest

    sealed = seal_manifest({"format": "mxrepack-manifest", "target": {"options": {2: (1, 2), 10: 0.1}}, "files": {}})
    (tmp_path / MANIFEST).write_text(json.dumps(sealed, indent=2))
    assert check_manifest_digest(tmp_path, json.loads((tmp_path / MANIFEST).read_text())) == (None, None)


def test_make_fixture_cli_and_real_presets(tmp_path):
    from mxrepack import gptoss
    from mxrepack.repack.fixture import fixture_bytes, fixture_config

    proc = run("make-fixture", tmp_path / "f", "--layers", "3", "--layout", "original")
    assert proc.returncode == 0, proc.stderr
    ck = open_checkpoint(str(tmp_path / "f"))
    assert ck.layout == "original" and ck.dims.layers == 3 and ck.dims.hidden % 128 and ck.dims.intermediate % 128
    assert run("make-fixture", tmp_path / "f").returncode == 1  # exists, no --overwrite
    # the real shapes (writing them is the benchmark's job): formats.md 1.3
    d = gptoss.Dims.from_config(fixture_config("120b"))
    t = gptoss.expected_tensors(d)
    assert t["model.layers.35.mlp.experts.gate_up_proj_blocks"][0] == (128, 5760, 90, 16)
    assert t["model.layers.0.self_attn.q_proj.weight"][0] == (4096, 2880) and t["lm_head.weight"][0] == (201088, 2880)
    assert abs(fixture_bytes("120b") - 65_248_815_744) / 65_248_815_744 < 0.001  # the real index's total_size
    assert abs(fixture_bytes("20b") - 13_761_264_768) / 13_761_264_768 < 0.001


def test_reference_gemm_and_expert(tiny):
    ck = open_checkpoint(str(tiny))
    p = "model.layers.0.mlp.experts."
    parts = {k: ck.tensors[p + k].read() for k in EXPERT_PARTS}
    x = torch.randn(5, 288).to(torch.bfloat16)
    y = mxfp4_linear(x, parts["gate_up_proj_blocks"][1], parts["gate_up_proj_scales"][1], parts["gate_up_proj_bias"][1])
    w = dense_weights(parts)
    assert (
        tensor_error(x.double() @ w["gate_up_proj"][1].double().T + w["gate_up_proj_bias"][1].double(), y)["rel_fro"]
        < 1e-6
    )
    assert expert_mlp(x, w, 2).shape == (5, 288)
    e = tensor_error(torch.ones(4, dtype=torch.float64), torch.full((4,), 1.01, dtype=torch.float64))
    assert abs(e["rel_fro"] - 0.01) < 1e-9 and abs(e["sqnr_db"] - 40) < 1e-6
