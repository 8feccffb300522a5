"""The bf16 target loads in stock transformers and gives the same logits as the MXFP4 source."""

import pytest
import torch

transformers = pytest.importorskip("transformers")


def test_bf16_target_logits_equal_dequantized_source(tiny, tmp_path):
    from transformers import GptOssForCausalLM, Mxfp4Config

    from mxrepack.repack.pipeline import repack

    out = repack(str(tiny), "bf16", tmp_path / "bf16").out
    ref = GptOssForCausalLM.from_pretrained(
        str(tiny), quantization_config=Mxfp4Config(dequantize=True), dtype=torch.bfloat16
    )
    got = GptOssForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16)
    assert getattr(got.config, "quantization_config", None) is None
    ids = torch.randint(0, 512, (2, 40))  # longer than the sliding window (8): both attention kinds matter
    with torch.no_grad():
        a, b = ref(ids).logits, got(ids).logits
    assert torch.isfinite(a).all()
    assert torch.equal(a, b)  # same weights bit for bit, same code path: exactly equal
