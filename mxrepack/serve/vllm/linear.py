"""Dense MXFP4 layers (q/k/v/o, lm_head) from the stored bytes, on one of two kernels (``$MXREPACK_DENSE_KERNEL``).

The checkpoint stores compressed-tensors' ``weight_packed`` uint8 ``[N, K/2]`` and ``weight_scale`` E8M0 ``[N, K/32]``.

* :class:`MarlinMxfp4LinearMethod` (``marlin``, the default): vLLM's own ``prepare_fp4_layer_for_marlin`` turns them
  into Marlin's tiles at load (for gpt-oss-120b about 0.4 GB over 37 layers, against 61 GB of experts that need
  nothing), and ``apply_fp4_marlin_linear`` computes. This is the kernel vLLM itself picks for MXFP4 W4A16 linears on
  sm_12x (``MarlinMxFp4LinearKernel``), and the only one of vLLM's that takes gpt-oss's 2880-wide K without padding.
* :class:`TritonMxfp4LinearMethod` (``mxrepack``): mxrepack's :func:`~mxrepack.kernels.linear_mxfp4.linear_mxfp4` on
  the stored bytes as they are (nothing converted at load): the GEMV at one row, split-K tiles at decode,
  dequantize + cuBLAS for prefill. Called through a registered op (``torch.ops.mxrepack.linear_mxfp4``) where vLLM
  compiles the model, so that torch.compile sees one opaque call and its CUDA graphs capture the launches; an eager
  call (lm_head's, every step) calls the op's function directly.

A checkpoint whose dense values are in a chunk order (the dense layout's ``order``: "wgmma" for sm_90, "mma2" for
sm_12x / sm_8x; its config's ``groups.dense.order``) is served by :class:`TritonMxfp4LinearMethod` whatever kernel was
chosen: no other kernel reads those bytes (``linear_mxfp4``'s chunk-order tiles at up to 64 rows, dequantize + cuBLAS
past them).
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import LinearMethodBase
from vllm.model_executor.layers.quantization.utils.marlin_utils_fp4 import (
    apply_fp4_marlin_linear,
    prepare_fp4_layer_for_marlin,
)
from vllm.model_executor.utils import set_weight_attrs

from mxrepack.errors import MxRepackError
from mxrepack.kernels.linear_mxfp4 import WARM_ROWS, linear_mxfp4
from mxrepack.serve.spec import check_kernel_device


def make_dense_method(kernel: str, order: str = "rows") -> LinearMethodBase:
    """The method for one MXFP4 dense layer on ``kernel`` (:data:`mxrepack.serve.spec.DENSE_KERNELS`), as the
    engine's quant config chose it once (:func:`mxrepack.serve.spec.chosen_dense_kernel`). Values in a chunk
    ``order`` (the dense layout's "wgmma" / "mma2") are mxrepack's kernels' alone: that kernel whatever was chosen."""
    if order != "rows":
        return TritonMxfp4LinearMethod(order)
    return TritonMxfp4LinearMethod() if kernel == "mxrepack" else MarlinMxfp4LinearMethod()


class _StoredMxfp4Linear(LinearMethodBase):
    """The stored parameters, for a ``LinearBase`` (q/k/v fused, o) and for gpt-oss's ``ParallelLMHead`` (same
    positional contract): ``[N, K/2]`` and ``[N, K/32]``, or in a chunk order (``order``) padded to 16 rows and 128
    columns (each of q, k and v is whole 16-row tiles: the fused rows are the stored rows one after the other)."""

    order = "rows"

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
        rows, kp = n, k
        if self.order != "rows":
            rows, kp = -(-n // 16) * 16, -(-k // 128) * 128
            if any(width % 16 for width in output_partition_sizes):
                raise ValueError(f"the {self.order} order stores whole 16-row tiles: rows {output_partition_sizes}")
        for name, cols in (("weight_packed", kp // 2), ("weight_scale", kp // 32)):
            p = torch.nn.Parameter(torch.empty(rows, cols, dtype=torch.uint8), requires_grad=False)
            # Row-sharded like a Linear weight: the layers' own loaders place q/k/v and narrow by rank.
            set_weight_attrs(p, {"input_dim": 1, "output_dim": 0, **extra_weight_attrs})
            layer.register_parameter(name, p)


class MarlinMxfp4LinearMethod(_StoredMxfp4Linear):
    """vLLM's Marlin MXFP4 linear, its tiles made from the stored bytes at load."""

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


def _linear_mxfp4_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    fold_scale: bool,
    order: str,
    n: int,
) -> torch.Tensor:
    if x.dtype != torch.bfloat16:
        raise ValueError(f"mxrepack.linear_mxfp4 takes bf16 activations, got {x.dtype}")
    if x.shape[0] == 0:  # no tokens (a dummy batch): no launch with an empty grid
        return x.new_empty(0, n)
    out = x.new_empty(x.shape[0], n)
    return linear_mxfp4(x, weight, scale, bias, fold_scale=fold_scale, order=order, out=out)


def _linear_mxfp4_fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    fold_scale: bool,
    order: str,
    n: int,
) -> torch.Tensor:
    return x.new_empty(x.shape[0], n, dtype=torch.bfloat16)


_LIB: torch.library.Library | None = None  # holds the op while the process lives


def _register_op() -> None:
    """``torch.ops.mxrepack.linear_mxfp4``, registered once, when the first layer asks for mxrepack's kernels (the
    default Marlin path needs none of it), the way vLLM registers its own kernels (no ``torch.library.custom_op``
    dispatch overhead per call). A graph loaded from vLLM's compile cache calls it after the model, and so this, is
    built."""
    global _LIB
    if _LIB is not None:
        return
    try:
        from vllm.utils.torch_utils import direct_register_custom_op
    except ImportError:  # older layouts of vllm.utils
        from vllm.utils import direct_register_custom_op

    _LIB = torch.library.Library("mxrepack", "FRAGMENT")
    direct_register_custom_op("linear_mxfp4", _linear_mxfp4_op, fake_impl=_linear_mxfp4_fake, target_lib=_LIB)


class TritonMxfp4LinearMethod(_StoredMxfp4Linear):
    """mxrepack's Triton kernels on the stored bytes (:func:`mxrepack.kernels.linear_mxfp4.linear_mxfp4`).

    Each layer shape's kernels are compiled at load for every row-count class (:data:`WARM_ROWS`), once a process:
    vLLM warms only what its CUDA graphs capture, runs lm_head outside them (logits at 1 to ``max_num_seqs`` rows, and
    a whole prompt chunk's for prompt logprobs) and captures nothing with ``enforce_eager``, so its first requests
    compiled them during inference (vLLM 0.26's JIT monitor warned; ``--jit-monitor-mode error`` would fail)."""

    # (rows, columns, device, folded, order, has bias): shapes whose kernels this process compiled
    warmed: set[tuple] = set()

    def __init__(self, order: str = "rows"):
        self.order = order
        _register_op()

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        from mxrepack.kernels.arrival import arrival_counters, keep_with
        from mxrepack.kernels.dequant_mxfp4 import check_order, fits_fold

        check_kernel_device(layer.weight_packed.device, "this checkpoint's dense MXFP4 layers")
        try:  # a chunk order is one GPU family's MMA operand: refused at load elsewhere, not at the first step
            check_order(self.order, "bf16", layer.weight_packed.device)
        except ValueError as e:
            raise MxRepackError(f"this checkpoint's dense MXFP4 layers are in the {self.order} order: {e}") from None

        # asked once per weight here (it synchronizes): the swapped tiles fold E2M1's bias into the scale where the
        # scales allow it (same bits, faster)
        layer.mxrepack_fold_scale = fits_fold(layer.weight_scale)
        device = layer.weight_packed.device
        # with the bias the layer's forward passes (q/k/v and o have one in gpt-oss): the kernels specialize on it
        bias = None if getattr(layer, "skip_bias_add", False) else getattr(layer, "bias", None)
        shape = (*layer.weight_packed.shape, str(device), layer.mxrepack_fold_scale, self.order, bias is not None)
        if shape not in self.warmed:
            x = torch.zeros(max(WARM_ROWS), layer.input_size_per_partition, dtype=torch.bfloat16, device=device)
            # vLLM loads with autograd on (its forward runs in inference mode) and leaves the bias requiring grad: a
            # torch op with out= on it would refuse it (b8d4f4b)
            with torch.no_grad():
                for m in WARM_ROWS:
                    self.apply(layer, x[:m], bias)
            self.warmed.add(shape)
        # the split-K tiles' counters, before vLLM captures its CUDA graphs (a capture cannot allocate them): after the
        # warm-up, which grew them to what its row classes need (a later, larger call would allocate anew), kept among
        # the layer's buffers for vLLM's sleep mode
        keep_with(layer, arrival_counters(device, 1, "linear"))

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        # torch.compile traces the registered op (one opaque call). Run eagerly (lm_head always: vLLM computes the
        # logits outside its compiled graph, at every step), the op's function is called as it is: without the
        # dispatcher, apply took 0.79-0.85x of the host time (medians, inference mode, H200; 7-9 us less a call in 5 of
        # 6 cells; PERF.md "The plugin's dense call against Marlin's"), but is no longer named as an op in a profile
        call = torch.ops.mxrepack.linear_mxfp4 if torch.compiler.is_compiling() else _linear_mxfp4_op
        args = (layer.weight_packed, layer.weight_scale, bias, layer.mxrepack_fold_scale, self.order)
        # vLLM's calls (2-D BF16) go as they are: a no-op reshape or cast is still a torch call on the host
        if x.dim() == 2 and x.dtype == torch.bfloat16:
            return call(x, *args, layer.output_size_per_partition)
        lead, k = x.shape[:-1], x.shape[-1]
        y = call(x.reshape(-1, k).to(torch.bfloat16), *args, layer.output_size_per_partition)
        return y.view(*lead, y.shape[-1]).to(x.dtype)
