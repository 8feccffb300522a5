"""Dense MXFP4 layers (q/k/v/o, lm_head) on vLLM's Marlin MXFP4 linear kernel.

The checkpoint stores compressed-tensors' ``weight_packed`` uint8 ``[N, K/2]`` and ``weight_scale`` E8M0 ``[N, K/32]``;
vLLM's own ``prepare_fp4_layer_for_marlin`` turns them into Marlin's tiles at load (for gpt-oss-120b about 0.4 GB
over 37 layers, against 61 GB of experts that need nothing), and ``apply_fp4_marlin_linear`` computes. This is the
kernel vLLM itself picks for MXFP4 W4A16 linears on sm_12x (``MarlinMxFp4LinearKernel``), and the only one that takes
gpt-oss's 2880-wide K without padding.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import LinearMethodBase
from vllm.model_executor.layers.quantization.utils.marlin_utils_fp4 import (
    apply_fp4_marlin_linear,
    prepare_fp4_layer_for_marlin,
)
from vllm.model_executor.utils import set_weight_attrs


class MarlinMxfp4LinearMethod(LinearMethodBase):
    """For a ``LinearBase`` (q/k/v fused, o) and for gpt-oss's ``ParallelLMHead`` (same positional contract)."""

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        n, k = sum(output_partition_sizes), input_size_per_partition
        # What prepare_fp4_layer_for_marlin reads; vLLM 0.26's ParallelLMHead does not set them itself.
        layer.logical_widths = list(output_partition_sizes)
        layer.input_size_per_partition, layer.output_size_per_partition = k, n
        layer.params_dtype = params_dtype
        for name, cols in (("weight_packed", k // 2), ("weight_scale", k // 32)):
            p = torch.nn.Parameter(torch.empty(n, cols, dtype=torch.uint8), requires_grad=False)
            # Row-sharded like a Linear weight: the layers' own loaders place q/k/v and narrow by rank.
            set_weight_attrs(p, {"input_dim": 1, "output_dim": 0, **extra_weight_attrs})
            layer.register_parameter(name, p)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        packed = layer.weight_packed
        del layer.weight_packed
        layer.weight = torch.nn.Parameter(packed.data, requires_grad=False)
        prepare_fp4_layer_for_marlin(layer)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return apply_fp4_marlin_linear(
            input=x,
            weight=layer.weight,
            weight_scale=layer.weight_scale,
            weight_global_scale=None,
            workspace=getattr(layer, "workspace", None),
            size_n=layer.output_size_per_partition,
            size_k=layer.input_size_per_partition,
            bias=bias,
        )
