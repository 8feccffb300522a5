"""repack push: planning, the model card, refusals, and the upload calls (no network in any test)."""

import json
import socket

import pytest
import yaml

from mxrepack.cli import main
from mxrepack.errors import MxRepackError
from mxrepack.hub import plan_push, push
from mxrepack.repack.pipeline import repack


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a network connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def output(tiny, tmp_path):
    return repack(str(tiny), "sm121", tmp_path / "tiny-sm121").out


def _front_matter(card: str) -> dict:
    return yaml.safe_load(card.split("---")[1])


def test_dry_run_prints_plan_and_card_without_network(output, no_network, capsys, tmp_path):
    gpqa = tmp_path / "gpqa.json"
    gpqa.write_text(
        json.dumps(
            {
                "eval": "gpqa",
                "score": 0.81,
                "stderr": 0.012,
                "n_samples": 1584,
                "n_repeats": 8,
                "data": {"path": "gpqa_diamond.csv"},
            }
        )
    )
    assert main(["push", str(output), "--repo-id", "me/tiny-sm121", "--dry-run", "--eval", str(gpqa)]) == 0
    text = capsys.readouterr().out
    assert "repo: me/tiny-sm121 (public), revision: main" in text and "dry run: nothing was sent" in text
    assert "model-00001-of-00001.safetensors" in text and "mxrepack.json" in text and "README.md" in text
    assert not (output / "README.md").exists()  # a dry run writes nothing either
    failed = tmp_path / "failed.json"  # every request failed: no score to publish, one line, nothing sent
    failed.write_text(
        json.dumps(
            {
                "eval": "gpqa",
                "score": None,
                "stderr": None,
                "n_samples": 0,
                "n_repeats": 8,
                "errors": 40,
                "n_requests": 40,
                "max_errors": 2,
                "too_many_errors": True,
                "first_error": "HTTP 400",
                "data": {"path": "gpqa_diamond.csv"},
            }
        )
    )
    assert main(["push", str(output), "--repo-id", "me/tiny-sm121", "--dry-run", "--eval", str(failed)]) != 0
    assert "40 of 40 requests failed" in capsys.readouterr().err


def test_card_metadata_and_body(output, tmp_path, no_network):
    manifest_path = output / "mxrepack.json"
    manifest = json.loads(manifest_path.read_text())
    gpqa = tmp_path / "gpqa.json"
    gpqa.write_text(
        json.dumps(
            {
                "eval": "gpqa",
                "score": 0.81,
                "stderr": 0.012,
                "n_samples": 1584,
                "n_repeats": 8,
                "data": {"path": "gpqa_diamond.csv"},
            }
        )
    )
    plan = plan_push(output, "me/tiny-sm121", eval_paths=[gpqa])
    meta = _front_matter(plan.card)
    assert "gpt_oss" in meta["tags"] and "mxfp4" in meta["tags"] and "sm121" in meta["tags"] and "vllm" in meta["tags"]
    assert meta["library_name"] == "vllm"  # served through the plugin, not loaded by transformers
    results = meta["model-index"][0]["results"]
    assert results[0]["metrics"][0]["value"] == 0.81 and results[0]["metrics"][0]["type"] == "accuracy"
    assert "| GPQA-style (gpqa_diamond.csv, 8 repeats) | accuracy | 0.8100 | 0.0120 | 1584 |" in plan.card
    assert "flashinfer-cutlass" in plan.card and "hidden 288→384" in plan.card and "repack verify" in plan.card
    assert 'pip install "mxrepack[vllm]"\nvllm serve me/tiny-sm121' in plan.card
    assert "`--load-format mxrepack`: the plugin's reader (threads, page-locked staging), optional;" in plan.card
    assert (
        "Dense MXFP4 kernel: vLLM's Marlin MXFP4 linear" in plan.card and "MXREPACK_DENSE_KERNEL=mxrepack" in plan.card
    )
    assert manifest["tool"]["mxrepack"] in plan.card
    # a Hub source carries its base model, the quantized relation and its license
    manifest["source"] = {**manifest["source"], "repo_id": "openai/gpt-oss-120b", "path": None}
    from mxrepack.hub import render_card

    meta = _front_matter(render_card(manifest, "me/gpt-oss-120b-sm121"))
    assert meta["base_model"] == "openai/gpt-oss-120b" and meta["base_model_relation"] == "quantized"
    assert meta["license"] == "apache-2.0"


def test_refuses_unverified_or_unmanifested_directories(output, tmp_path, no_network):
    with pytest.raises(MxRepackError, match="no manifest"):
        plan_push(tmp_path, "me/x")
    shard = next(output.glob("model-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(MxRepackError, match="refusing to push, the manifest does not verify: .*sha256 differs"):
        plan_push(output, "me/x")
    with pytest.raises(MxRepackError, match="expected ORG/NAME"):
        plan_push(output, "noslash")


def test_no_token_and_offline_are_one_line_errors(output, monkeypatch, tmp_path, no_network):
    plan = plan_push(output, "me/x")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored login either
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    with pytest.raises(MxRepackError, match="offline mode"):
        push(plan)
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    with pytest.raises(MxRepackError, match="no Hugging Face token: set HF_TOKEN"):
        push(plan)


def test_push_calls_create_repo_branch_and_one_commit_of_the_listed_files(output, no_network):
    calls = []

    class FakeApi:
        def create_repo(self, repo_id, **kw):
            calls.append(("create_repo", repo_id, kw))
            return f"https://huggingface.co/{repo_id}"

        def create_branch(self, repo_id, **kw):
            calls.append(("create_branch", repo_id, kw))

        def create_commit(self, repo_id, operations, **kw):
            calls.append(("create_commit", repo_id, {**kw, "operations": list(operations)}))

    # what a download from the Hub holds besides the files: accepted by verify, never uploaded from here
    (output / "README.md").write_text("an old card")
    (output / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (output / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (output / ".cache" / "huggingface" / "download" / "config.json.metadata").write_text("x")
    plan = plan_push(output, "me/tiny-sm121", private=True, revision="v1", commit_message="first")
    manifest = json.loads((output / "mxrepack.json").read_text())
    assert [n for n, _ in plan.files] == sorted([*manifest["files"], "mxrepack.json", "README.md"])
    assert push(plan, api=FakeApi()) == "https://huggingface.co/me/tiny-sm121"
    assert calls[0] == ("create_repo", "me/tiny-sm121", {"private": True, "repo_type": "model", "exist_ok": True})
    assert calls[1][0] == "create_branch" and calls[1][2]["branch"] == "v1" and calls[1][2]["exist_ok"]
    commit = calls[2][2]
    assert calls[2][0] == "create_commit" and commit["revision"] == "v1" and commit["commit_message"] == "first"
    ops = {op.path_in_repo: op for op in commit["operations"]}
    assert sorted(ops) == sorted([*manifest["files"], "mxrepack.json", "README.md"])
    assert ops["README.md"].path_or_fileobj == plan.card.encode()  # the card, from memory
    assert ops["mxrepack.json"].path_or_fileobj == str(output / "mxrepack.json")
    assert (output / "README.md").read_text() == "an old card"  # nothing written into the output

    class Failing(FakeApi):
        def create_commit(self, repo_id, operations, **kw):
            raise ConnectionError("connection reset by peer\nsecond line")

    with pytest.raises(MxRepackError, match=r"push to me/tiny-sm121 failed: connection reset by peer \(re-run"):
        push(plan, api=Failing())


def test_an_unlisted_file_is_refused_not_uploaded(output, no_network):
    (output / "notes.txt").write_text("private")
    with pytest.raises(
        MxRepackError,
        match=r"refusing to push, the manifest does not verify: .*notes\.txt: not listed in "
        r"the manifest \(mxrepack did not write it\); move it out of the output",
    ):
        plan_push(output, "me/x")
    (output / "notes.txt").unlink()
    (output / "sub").mkdir()
    (output / "sub" / "model-00099.safetensors").write_bytes(b"x")
    with pytest.raises(MxRepackError, match=r"sub/model-00099\.safetensors: not listed in the manifest"):
        plan_push(output, "me/x")


@pytest.mark.parametrize("edit", ["target", "error figure", "digest removed", "old format"])
def test_an_edited_manifest_cannot_reach_a_card(output, no_network, edit):
    path = output / "mxrepack.json"
    manifest = json.loads(path.read_text())
    if edit == "target":
        manifest["target"]["name"] = "sm90"
    elif edit == "error figure":
        first = next(iter(manifest["quantization_error"]))
        manifest["quantization_error"][first]["rel_fro"] = 0.0001
    elif edit == "digest removed":
        del manifest["manifest_sha256"]
    else:  # a manifest written before the digest existed
        del manifest["manifest_sha256"]
        manifest["format_version"] = 1
    path.write_text(json.dumps(manifest, indent=2))
    message = {
        "old format": "format 1 has no manifest_sha256",
        "digest removed": "its manifest_sha256 was removed",
    }.get(edit, "edited since mxrepack wrote it")
    with pytest.raises(
        MxRepackError, match=f"refusing to push, the manifest does not verify: .*mxrepack.json: {message}"
    ):
        plan_push(output, "me/x")
    assert main(["push", str(output), "--repo-id", "me/x", "--dry-run"]) == 1


def _card_for(output, target: str) -> tuple[dict, str]:
    """The card of ``output``'s manifest with another built-in target's recipe in it (render_card reads only the
    manifest)."""
    from mxrepack.hub import render_card
    from mxrepack.recipes import load_recipe

    manifest = json.loads((output / "mxrepack.json").read_text())
    r = load_recipe(target)
    manifest["target"] = {
        "name": r.name,
        "recipe_source": r.source,
        "recipe": r.data,
        "consumer": r.consumer,
        "engine": r.engine,
    }
    card = render_card(manifest, f"me/tiny-{target}")
    return _front_matter(card), card


def test_card_says_what_loads_each_kind_of_target(output, no_network):
    meta, card = _card_for(output, "bf16")
    assert meta["library_name"] == "transformers" and "mxfp4" not in meta["tags"] and "quantized" not in meta["tags"]
    assert 'pip install "transformers>=4.56"' in card and 'AutoModelForCausalLM.from_pretrained("me/tiny-bf16")' in card
    assert "pip install vllm\nvllm serve me/tiny-bf16" in card and "mxrepack[vllm]" not in card
    meta, card = _card_for(output, "mxfp4")
    assert meta["library_name"] == "transformers" and "quantized" in meta["tags"]
    assert "pip install vllm\nvllm serve me/tiny-mxfp4" in card and 'pip install "transformers>=4.56"' in card
    assert "repacks at every start" in card  # serve.spec.serving's words
    meta, card = _card_for(output, "compressed-tensors")
    assert meta["library_name"] == "vllm"  # through the plugin: stock vLLM cannot load gpt-oss's expert biases
    assert 'pip install "mxrepack[vllm]"\nvllm serve me/tiny-compressed-tensors' in card
    assert 'pip install "compressed-tensors>=0.19,<0.22"' in card and "no expert biases" in card
    assert "from_pretrained" not in card  # transformers does not load per-expert Linear experts
    meta, card = _card_for(output, "sm90")
    assert meta["library_name"] == "vllm" and 'pip install "mxrepack[vllm]"\nvllm serve me/tiny-sm90' in card
    meta, card = _card_for(output, "sm90-strided")  # mxrepack's own kernels, in an order for sm90 only
    assert meta["library_name"] == "vllm" and "wgmma order [sm90 (H100/H200) only]" in card


def test_a_result_of_other_weights_is_not_published_with_this_output(output, tiny, tmp_path):
    # `eval logits` of another output, passed to push by mistake, would put its figures on this model's card
    other = repack(str(tiny), "sm80", tmp_path / "tiny-sm80").out
    logits = {"eval": "logits", "candidate": str(other), "kl": {"mean": 0.1}, "same_top": 0.9, "tokens": 8}
    result = tmp_path / "logits.json"
    result.write_text(json.dumps(logits))
    with pytest.raises(MxRepackError, match="evaluates .*tiny-sm80, whose weights are not .*tiny-sm121's"):
        plan_push(output, "me/x", eval_paths=[result])
    for evaluated in (str(output), str(tmp_path / "moved-away")):  # its own result; a folder gone cannot be told
        result.write_text(json.dumps(logits | {"candidate": evaluated, "text": "t.txt"}))
        assert "KL divergence to the source" in plan_push(output, "me/x", eval_paths=[result]).card
    # the weights a result recorded decide, wherever its folder is now: one of an earlier conversion to this path
    result.write_text(json.dumps(logits | {"candidate": str(output), "candidate_weights": "manifest:0123456789abcdef"}))
    with pytest.raises(MxRepackError, match="whose weights are not"):
        plan_push(output, "me/x", eval_paths=[result])


def test_push_to_hub_without_a_token_fails_before_converting(tiny, tmp_path, monkeypatch, capsys, no_network):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)  # no saved login either (read at import)
    out = tmp_path / "out"
    assert main([str(tiny), "--target", "sm121", "--out", str(out), "--push-to-hub", "me/x"]) == 1
    assert "no Hugging Face token" in capsys.readouterr().err
    assert not out.exists()  # minutes of conversion not spent on an output that cannot be pushed


def test_a_revision_for_a_local_folder_is_refused(tiny, tmp_path):
    with pytest.raises(MxRepackError, match="--revision v1: .* is a local folder"):
        repack(str(tiny), "sm121", tmp_path / "out", revision="v1")
