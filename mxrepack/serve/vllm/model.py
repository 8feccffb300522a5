"""vLLM's gpt-oss model class, extended for mxrepack checkpoints; any other checkpoint takes the parent's code
unchanged.

Two things vLLM's ``GptOssForCausalLM`` cannot do for stored kernel layouts:

* its loader sends every name containing ``.w13_weight``/``.w2_weight``/``.w13_bias``/``.w2_bias`` through a
  transpose and a direct copy (it expects transformers' BF16 ``[E, in, out]`` experts), bypassing the parameters'
  loaders: :meth:`load_weights` gives the stored expert tensors to their parameters' loaders first and passes every
  other tensor (attention, norms, router, sinks, embeddings, dense MXFP4 q/k/v/o) to the parent;
* it builds lm_head without a quantization config: :meth:`__init__` builds it with the checkpoint's when lm_head is
  stored as MXFP4, so the BF16 one is never allocated.

And one thing it cannot do for a compressed-tensors checkpoint of gpt-oss (mxrepack's ``compressed-tensors`` target, or
llm-compressor's layout of it): vLLM's compressed-tensors MXFP4 MoE method has no expert biases, and its gpt-oss loader
expects fused ``[E, ...]`` expert tensors, not per-expert ``gate_proj``/``up_proj``/``down_proj`` Linear tensors. So the
experts of such a checkpoint get vLLM's own gpt-oss MXFP4 MoE method (biases, SwiGLU-OAI, its backend choice per GPU,
converted at load as for the original checkpoint), and :meth:`load_weights` writes each expert's tensors into its
parameters (gate into the even rows of ``w13``, up into the odd rows: the interleaving that method's activation reads).
The attention layers keep vLLM's compressed-tensors linear methods.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from contextlib import contextmanager

import torch
from vllm.model_executor.models import gpt_oss

from mxrepack.errors import MxRepackError
from mxrepack.serve.spec import ct_expert_destination, ct_gpt_oss_mxfp4_experts, place_ct_expert
from mxrepack.serve.vllm.config import MxRepackConfig, check_single_shard

_EXPERT_PARAM = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(?:.+\.)?([^.]+)")


class MxRepackGptOssForCausalLM(gpt_oss.GptOssForCausalLM):
    """vLLM's gpt-oss model class, registered under its own name: an mxrepack checkpoint gets a quantized lm_head
    where stored so and its expert tensors go to their parameters' loaders; a compressed-tensors gpt-oss checkpoint
    gets vLLM's gpt-oss MXFP4 experts; any other checkpoint runs the parent's code unchanged."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        config = vllm_config.quant_config if isinstance(vllm_config.quant_config, MxRepackConfig) else None
        hf_quant = getattr(vllm_config.model_config.hf_config, "quantization_config", None)
        ct = vllm_config.quant_config if ct_gpt_oss_mxfp4_experts(hf_quant) else None
        with _lm_head_quantized_by(config), _experts_as_gpt_oss_mxfp4(ct):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.mxrepack_config = config
        self.ct_experts = ct is not None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The stored expert tensors into their parameters' loaders (as stored, no transpose), every other tensor to
        the parent's loader; returns the parameters' names loaded (what vLLM's weight tracking compares with the
        model's parameters)."""
        if self.ct_experts:
            return self._load_ct_weights(weights)
        if self.mxrepack_config is None:
            return super().load_weights(weights)
        stored = self.mxrepack_config.spec.stored
        # checkpoint name -> (parameter name, parameter): the module path differs between versions (0.33 adds
        # ".routed_experts")
        params: dict[str, tuple[str, torch.nn.Parameter]] = {}
        for name, p in self.named_parameters():
            hit = _EXPERT_PARAM.fullmatch(name)
            if hit and hit[2] in stored:
                params[f"{hit[1]}.{hit[2]}"] = (name, p)
        loaded: set[str] = set()

        def the_rest():
            for name, tensor in weights:
                hit = _EXPERT_PARAM.fullmatch(name)
                if hit and hit[2] in stored:
                    if name in params:  # absent: a layer of another pipeline stage
                        param_name, param = params[name]
                        param.weight_loader(param, tensor)
                        loaded.add(param_name)
                    continue
                yield name, tensor

        return loaded | set(super().load_weights(the_rest()))

    def _load_ct_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Per-expert compressed-tensors tensors into the gpt-oss MXFP4 method's fused parameters; the rest to the
        parent."""
        params: dict[str, tuple[str, torch.nn.Parameter]] = {}
        for name, p in self.named_parameters():
            hit = _EXPERT_PARAM.fullmatch(name)
            if hit:
                params[f"{hit[1]}.{hit[2]}"] = (name, p)
        loaded: set[str] = set()

        def the_rest():
            for name, tensor in weights:
                where = ct_expert_destination(name)
                if where is None:
                    yield name, tensor
                    continue
                key, expert, parity = where
                if key not in params:
                    if not any(k.startswith(key.rsplit(".", 1)[0] + ".") for k in params):
                        continue  # a layer of another pipeline stage
                    raise MxRepackError(
                        f"{name}: vLLM's gpt-oss MXFP4 MoE method has no parameter for it (expected {key})"
                    )
                param_name, param = params[key]
                place_ct_expert(param.data, expert, parity, tensor, name)
                loaded.add(param_name)

        return loaded | set(super().load_weights(the_rest()))


@contextmanager
def _experts_as_gpt_oss_mxfp4(quant_config):
    """While the parent builds the model, the experts' method is vLLM's gpt-oss MXFP4 one; every other layer asks the
    checkpoint's compressed-tensors config as before."""
    if quant_config is None:
        yield
        return
    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4MoEMethod

    original = quant_config.get_quant_method

    def get_quant_method(layer, prefix):
        if isinstance(layer, RoutedExperts):
            check_single_shard(layer, prefix)
            return GptOssMxfp4MoEMethod(layer.moe_config)
        return original(layer, prefix)

    quant_config.get_quant_method = get_quant_method
    try:
        yield
    finally:
        del quant_config.get_quant_method


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
