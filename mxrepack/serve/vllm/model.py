"""vLLM's gpt-oss model class, extended for mxrepack checkpoints; any other checkpoint takes the parent's code unchanged.

Two things vLLM's ``GptOssForCausalLM`` cannot do for stored kernel layouts:

* its loader sends every name containing ``.w13_weight``/``.w2_weight``/``.w13_bias``/``.w2_bias`` through a
  transpose and a direct copy (it expects transformers' BF16 ``[E, in, out]`` experts), bypassing the parameters'
  loaders: :meth:`load_weights` gives the stored expert tensors to their parameters' loaders first and passes every
  other tensor (attention, norms, router, sinks, embeddings, dense MXFP4 q/k/v/o) to the parent;
* it builds lm_head without a quantization config: :meth:`__init__` builds it with the checkpoint's when lm_head is
  stored as MXFP4, so the BF16 one is never allocated.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from contextlib import contextmanager

import torch
from vllm.model_executor.models import gpt_oss

from mxrepack.serve.vllm.config import MxRepackConfig

_EXPERT_PARAM = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(?:.+\.)?([^.]+)")


class MxRepackGptOssForCausalLM(gpt_oss.GptOssForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        config = vllm_config.quant_config if isinstance(vllm_config.quant_config, MxRepackConfig) else None
        with _lm_head_quantized_by(config):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.mxrepack_config = config

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        if self.mxrepack_config is None:
            return super().load_weights(weights)
        stored = self.mxrepack_config.spec.stored
        params: dict[str, torch.nn.Parameter] = {}
        for name, p in self.named_parameters():
            hit = _EXPERT_PARAM.fullmatch(name)
            if hit and hit[2] in stored:
                params[f"{hit[1]}.{hit[2]}"] = p  # the checkpoint name; the module path differs between versions
        loaded: set[str] = set()

        def the_rest():
            for name, tensor in weights:
                hit = _EXPERT_PARAM.fullmatch(name)
                if hit and hit[2] in stored:
                    param = params.get(name)
                    if param is not None:  # absent: a layer of another pipeline stage
                        param.weight_loader(param, tensor)
                        loaded.add(name)
                    continue
                yield name, tensor

        return loaded | set(super().load_weights(the_rest()))


@contextmanager
def _lm_head_quantized_by(config: MxRepackConfig | None):
    """Give gpt-oss's ``ParallelLMHead(...)`` call the quantization config while the parent constructs the model
    (construction is single-threaded; the name is restored right after)."""
    if config is None or not config.spec.lm_head_quantized:
        yield
        return
    original = gpt_oss.ParallelLMHead
    gpt_oss.ParallelLMHead = functools.partial(original, quant_config=config)
    try:
        yield
    finally:
        gpt_oss.ParallelLMHead = original
