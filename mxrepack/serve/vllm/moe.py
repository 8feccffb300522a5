"""gpt-oss experts from their stored kernel layout: parameters in the stored shapes, bytes loaded as stored, no repack.

Two methods:

* :class:`PreconvertedMoEMethod` -- vLLM's own gpt-oss MXFP4 method (``GptOssMxfp4MoEMethod``) with its load-time
  conversion (``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format``) taken out: the backend is the one the layout was
  written for (not vLLM's choice for the GPU), and after loading only the tail of vLLM's ``_setup_kernel`` runs
  (quant config, then ``make_mxfp4_moe_kernel``). ``apply`` is vLLM's. Layouts ``marlin``, ``triton-hopper``,
  ``trtllm``, ``flashinfer-cutlass``.
* :class:`StridedMoEMethod` -- the ``strided`` layout on mxrepack's own Triton kernels (:func:`moe_mxfp4`), which
  build for sm_120a/121a where triton_kernels does not. Routing is vLLM's (its router's top-k), so the kernels see
  exactly the assignments any other backend would.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import torch
import vllm.model_executor.layers.quantization.mxfp4 as vllm_mxfp4
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase
from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle
from vllm.model_executor.utils import set_weight_attrs
from vllm.utils import flashinfer as vllm_flashinfer

from mxrepack.errors import MxRepackError
from mxrepack.serve.spec import (
    ServeSpec,
    check_kernel_device,
    check_moe_activation,
    check_moe_backend_request,
    missing_kernels_hint,
    order_advice,
)

# under vLLM's configured "vllm" logger, whose handler and level every line of an engine goes through: a logger named
# outside it loses INFO lines (only "vllm" has a handler: vllm/logger.py's DEFAULT_LOGGING_CONFIG)
logger = init_logger("vllm.mxrepack")


def make_moe_method(spec: ServeSpec, moe) -> FusedMoEMethodBase:
    """The experts' method for ``spec``'s stored layout: :class:`StridedMoEMethod` for ``strided``, else
    :class:`PreconvertedMoEMethod` on the vLLM backend the layout was written for (refused in one line where this GPU
    cannot run it, or where ``--moe-backend`` asks for another)."""
    requested = getattr(moe, "moe_backend", None)  # vLLM's FusedMoEConfig, 0.26 and 0.33: "auto" unless asked
    try:
        candidates = [b.name for b in oracle.map_mxfp4_backend(requested)]
    except ValueError:  # a name this vLLM maps to no MXFP4 backend ("auto" included: no request, checked below)
        candidates = None
    check_moe_backend_request(requested, candidates, spec)
    if spec.layout == "strided":
        return StridedMoEMethod(moe, spec)
    return PreconvertedMoEMethod(moe, spec)


def _pinned_backend(spec: ServeSpec, moe):
    """(vLLM backend, its experts class) for the stored layout, or one line saying why this GPU cannot run it."""
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk

    backend = oracle.Mxfp4MoeBackend[spec.backend.vllm_backend]
    act_key = oracle._backend_activation_key(backend)
    reasons = []
    for cls in oracle.backend_to_kernel_cls(backend):
        ok, reason = cls.is_supported_config(
            cls, moe, oracle.kMxfp4Static, act_key, mk.FusedMoEActivationFormat.Standard
        )
        if ok:
            return backend, cls
        reasons.append(f"{cls.__name__}: {reason}")
    major = torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 0
    hint = missing_kernels_hint(spec.backend, major, lambda name: getattr(vllm_flashinfer, name)())
    raise MxRepackError(
        f"this checkpoint's experts are laid out for vLLM's {backend.name} backend (target "
        f"{spec.target}; {spec.backend.gpus}), which cannot run here: {'; '.join(reasons)}{hint}"
    )


@contextmanager
def _backend_choice(pinned):
    """vLLM's method picks its backend in ``__init__`` from the GPU; the stored bytes fix it. Swapping the selector
    for the constructor call (model construction is single-threaded) keeps every other attribute vLLM sets."""
    original = vllm_mxfp4.select_mxfp4_moe_backend
    vllm_mxfp4.select_mxfp4_moe_backend = lambda *args, **kwargs: pinned
    try:
        yield
    finally:
        vllm_mxfp4.select_mxfp4_moe_backend = original


class _StoredExperts:
    """Parameters in the stored shapes and dtypes, each filled by a loader that copies the stored tensor as it is
    (after checking its dtype and shape) and records it, so a missing tensor is an error, not garbage."""

    spec: ServeSpec

    def _create_stored(self, layer: torch.nn.Module, num_experts: int, extra_weight_attrs: dict) -> None:
        extra = {k: v for k, v in extra_weight_attrs.items() if k != "weight_loader"}  # vLLM's narrows by rank
        self._loaded: set[str] = set()
        for suffix, (dtype, shape) in self.spec.stored.items():
            if shape[0] != num_experts:
                raise MxRepackError(
                    f"{layer.layer_name}.{suffix}: stored for {shape[0]} experts, the model has {num_experts}"
                )
            p = torch.nn.Parameter(torch.empty(shape, dtype=getattr(torch, dtype)), requires_grad=False)
            layer.register_parameter(suffix, p)
            set_weight_attrs(p, extra)
            p.weight_loader = self._loader(layer.layer_name, suffix)

    def _loader(self, layer_name: str, suffix: str):
        def load(param: torch.nn.Parameter, loaded: torch.Tensor, *args, **kwargs) -> None:
            if loaded.dtype != param.dtype and loaded.dtype.itemsize == param.dtype.itemsize:
                loaded = loaded.view(param.dtype)  # raw E8M0/FP8 bytes written as uint8 by older writers
            if loaded.dtype != param.dtype or loaded.shape != param.shape:
                raise MxRepackError(
                    f"{layer_name}.{suffix}: checkpoint tensor is {loaded.dtype} "
                    f"{list(loaded.shape)}, the config's {self.spec.layout} layout stores {param.dtype} "
                    f"{list(param.shape)}"
                )
            param.data.copy_(loaded)
            self._loaded.add(suffix)

        return load

    def _check_loaded(self, layer: torch.nn.Module) -> None:
        missing = sorted(set(self.spec.stored) - self._loaded)
        if missing:
            raise MxRepackError(f"{layer.layer_name}: {', '.join(missing)} not found in the checkpoint")


class PreconvertedMoEMethod(_StoredExperts, vllm_mxfp4.GptOssMxfp4MoEMethod):
    """vLLM's gpt-oss MXFP4 MoE method on stored bytes: backend pinned to the layout's, parameters in the stored
    shapes, no load-time conversion (see the module docstring)."""

    def __init__(self, moe, spec: ServeSpec):
        self.spec = spec
        with _backend_choice(_pinned_backend(spec, moe)):
            super().__init__(moe)
        if self.mxfp4_backend == oracle.Mxfp4MoeBackend.MARLIN:
            from vllm.model_executor.layers.quantization.utils.marlin_utils import get_marlin_input_dtype

            if get_marlin_input_dtype() is not None:
                raise MxRepackError(
                    "VLLM_MARLIN_INPUT_DTYPE is set: the stored Marlin weights and scales are for BF16 activations "
                    "(mxrepack writes no FP8-activation Marlin layout); unset it"
                )

    def maybe_roundup_sizes(self, hidden_size, intermediate_size_per_partition, act_dtype, moe_parallel_config):
        # The stored padding, not this vLLM's rule for the backend (TRT-LLM's intermediate rounding went 256 -> 128
        # between 0.26 and 0.33): the kernels and the activation padding follow the bytes.
        return self.spec.hidden[1], self.spec.intermediate[1]

    def create_weights(
        self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype, **extra_weight_attrs
    ):
        self.num_experts, self.hidden_size, self.intermediate_size = (
            num_experts,
            hidden_size,
            intermediate_size_per_partition,
        )
        layer.params_dtype, layer.num_experts = params_dtype, num_experts
        self._create_stored(layer, num_experts, extra_weight_attrs)

    def process_weights_after_loading(self, layer) -> None:
        self._check_loaded(layer)
        backend = self.mxfp4_backend
        if backend in oracle.TRITON_BACKENDS:
            self._wrap_for_triton_kernels(layer)
        elif backend == oracle.Mxfp4MoeBackend.MARLIN:
            for name in ("w13_weight_scale", "w2_weight_scale"):
                _retype(layer, name, torch.float8_e8m0fnu)
        elif backend in oracle.TRTLLM_BACKENDS:
            for name in ("w13_weight_scale", "w2_weight_scale"):
                _retype(layer, name, torch.float8_e4m3fn)  # vLLM's tag for these E8M0 bytes on this backend
            for name in ("w13_bias", "w2_bias"):
                layer.register_parameter(
                    name, torch.nn.Parameter(getattr(layer, name).data.float(), requires_grad=False)
                )
        # The tail of vLLM's GptOssMxfp4MoEMethod._setup_kernel, after its conversion.
        self.moe_quant_config = self.get_fused_moe_quant_config(layer)
        kwargs = dict(
            moe_quant_config=self.moe_quant_config,
            moe_config=self.moe,
            mxfp4_backend=backend,
            experts_cls=self.experts_cls,
            routing_tables=layer._expert_routing_tables(),
        )
        if "layer" in inspect.signature(oracle.make_mxfp4_moe_kernel).parameters:  # 0.26
            kwargs["layer"] = layer
        self.moe_kernel = oracle.make_mxfp4_moe_kernel(**kwargs)
        # 0.33 ends _setup_kernel with this (0.26 does not); a no-op for these four backends in both (the base class's,
        # and FlashInferExperts' override acts on NVFP4 weights only)
        self.moe_kernel.fused_experts.process_weights_after_loading(layer)

    def _wrap_for_triton_kernels(self, layer) -> None:
        """triton_kernels' tensor wrappers around the stored (already swizzled) bytes, as ``_swizzle_mxfp4`` leaves
        them: ``storage.data`` is the stored tensor transposed to ``[E, K-ish, N-ish]`` views, the layout object is
        built from the pre-swizzle shape, and nothing is swizzled again."""
        # vLLM (0.26 and 0.33) prefers a separately installed triton_kernels to its bundled copy; 3.8 renamed
        # matmul_ogs to matmul and changed the wrappers this builds (not read here: its source is not in vLLM's wheel)
        try:
            from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig
        except ImportError:
            raise MxRepackError(
                "the sm90 target's experts are wrapped for triton_kernels 3.5-3.6 (vLLM's bundled copy); the "
                "triton_kernels installed here has no matmul_ogs (3.8 or later): uninstall it, or repack for "
                "sm90-strided"
            ) from None
        from triton_kernels.numerics import InFlexData
        from triton_kernels.tensor import FP4, Storage, Tensor
        from triton_kernels.tensor_details import layout as tk_layout

        value_cls, value_opts = tk_layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
        scale_cls, scale_opts = tk_layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)
        if value_cls.__name__ != "HopperMXValueLayout" or scale_cls.__name__ != "HopperMXScaleLayout":
            raise MxRepackError(
                f"triton-hopper experts hold Hopper-swizzled bytes; this GPU's triton_kernels wants "
                f"{value_cls.__name__}/{scale_cls.__name__} (serve them on sm90)"
            )
        import triton_kernels.matmul_ogs_details.opt_flags as opt_flags

        opt_flags.update_opt_flags_constraints({"split_k": 1})  # what _swizzle_mxfp4 sets on sm90
        h, i = self.spec.hidden[1], self.spec.intermediate[1]
        E = self.num_experts
        configs = {}
        for w, K, N in (("w13", h, 2 * i), ("w2", i, h)):
            value, scale = getattr(layer, f"{w}_weight").data, getattr(layer, f"{w}_weight_scale").data
            groups = scale.shape[2] // 32  # the stored [E, N/32, 32 * groups]: groups padded as vLLM pads them
            v = Tensor(
                Storage(value.mT, value_cls(torch.Size([E, K // 2, N]), **value_opts)), dtype=FP4, shape=[E, K, N]
            )
            s = Tensor(
                Storage(scale.mT, scale_cls(torch.Size([E, groups, N]), **scale_opts)),
                dtype=torch.uint8,
                shape=[E, groups, N],
            )
            delattr(layer, f"{w}_weight")
            delattr(layer, f"{w}_weight_scale")
            setattr(layer, f"{w}_weight", v)
            kwargs = (
                {"weight_scale": s}
                if "weight_scale" in inspect.signature(PrecisionConfig).parameters
                else {"b_mx_scale": s, "b_microblock_size": 32}
            )
            configs[w] = PrecisionConfig(**kwargs, flex_ctx=FlexCtx(rhs_data=InFlexData()))
        self.w13_precision_config, self.w2_precision_config = configs["w13"], configs["w2"]


def _retype(layer: torch.nn.Module, name: str, dtype: torch.dtype) -> None:
    p = getattr(layer, name)
    if p.dtype != dtype:
        layer.register_parameter(name, torch.nn.Parameter(p.data.view(dtype), requires_grad=False))


def _max_batched_tokens(default: int = 8192) -> int:
    """The engine's ``max_num_batched_tokens`` (the most tokens one step, so one MoE call, takes), or ``default``
    where no engine config is current."""
    try:
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        return int(config.scheduler_config.max_num_batched_tokens) if config is not None else default
    except Exception:  # noqa: BLE001 - an engine without the call (another vLLM release): the default
        return default


class StridedMoEMethod(_StoredExperts, FusedMoEMethodBase):
    """The ``strided`` layout on :func:`mxrepack.kernels.moe_mxfp4.moe_mxfp4` (BF16 activations), in the byte order
    the checkpoint records (``ServeSpec.strided_order``; a chunk order refused at load off the GPUs whose MMA operand
    it is: ``moe_mxfp4.check_order``)."""

    def __init__(self, moe, spec: ServeSpec):
        super().__init__(moe)
        self.spec = spec
        # vLLM's MoE config: an MoEActivation (0.26, 0.33) and SwiGLU constants (None for gpt-oss)
        activation = getattr(moe.activation, "value", moe.activation)
        check_moe_activation(activation, getattr(moe, "swiglu_alpha", None), getattr(moe, "swiglu_limit", None))

    def create_weights(
        self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype, **extra_weight_attrs
    ):
        layer.params_dtype, layer.num_experts = params_dtype, num_experts
        self._create_stored(layer, num_experts, extra_weight_attrs)

    def process_weights_after_loading(self, layer) -> None:
        from mxrepack.kernels.arrival import keep_with
        from mxrepack.kernels.dequant_mxfp4 import device_capability, fold_shift, native_order
        from mxrepack.kernels.moe_mxfp4 import check_order, reserve_decode_counters

        self._check_loaded(layer)
        order, device = self.spec.strided_order, layer.w2_weight.device
        check_kernel_device(device, "this checkpoint's strided experts")
        try:  # the chunk orders are one GPU family's MMA operand: refused at load elsewhere, not at the first step
            check_order(order, "bf16", device)
        except ValueError as e:
            raise MxRepackError(f"this checkpoint's experts are in the strided layout's {order} order: {e}") from None
        native = native_order(device)
        if order == "rows" and native != "rows":  # the GPU's own chunk order served batches faster where it was timed
            advice = order_advice(order, native, device_capability(device)[0])
            if advice:
                logger.info_once(advice)  # once, not a line per MoE layer (vLLM's info_once: local rank 0)
        # before vLLM captures its CUDA graphs: counters first allocated in a capture would never be zeroed. As much as
        # any call takes (the warm-up below included), kept among the layer's buffers for vLLM's sleep mode
        keep_with(layer, reserve_decode_counters(device, self.spec.hidden[1]))
        # whether these experts take the folded decode, and with which shift (scales above 128): asked once here (a
        # synchronization), not per call. Scales written into the parameters after this (not through vLLM's
        # loading, which ends here again) go unchecked
        shift = fold_shift(layer.w13_weight_scale, layer.w2_weight_scale)
        layer.mxrepack_fold_scale, layer.mxrepack_scale_shift = shift is not None, shift or 0
        self._warm(layer)

    # (shapes, device, order, fold, shift, topk, hidden, tokens): experts whose kernels this process compiled
    warmed: set[tuple] = set()

    def _warm(self, layer) -> None:
        """Compile at load every kernel variant that a call of 1 to ``max_num_batched_tokens`` tokens launches
        (:func:`moe_mxfp4.warm_token_counts`: about 40 calls, once per process and layer shape). vLLM's CUDA graphs
        capture decode sizes only, so a prompt's prefill, or what a prefix-cache hit leaves of it, of a size not seen
        before compiled during inference: the 12-layer check's first timed 64-sequence run decoded at 1315 tok/s
        against 11677 for the next (docs/SERVING.md)."""
        from mxrepack.kernels.moe_mxfp4 import warm_moe

        device = layer.w2_weight.device
        w = {name: getattr(layer, name) for name in self.spec.stored}
        fold, shift, order = layer.mxrepack_fold_scale, layer.mxrepack_scale_shift, self.spec.strided_order
        topk, hidden = self.moe.experts_per_token, self.spec.hidden[0]
        # a step's tokens; all-gathered over data- (and prefill-context-) parallel ranks before the experts, which
        # take no dispatch of their own (vLLM's naive dispatch)
        tokens = _max_batched_tokens() * getattr(self.moe, "dp_size", 1) * getattr(self.moe, "pcp_size", 1)
        key = (tuple(tuple(t.shape) for t in w.values()), str(device), order, fold, shift, topk, hidden, tokens)
        if key in self.warmed:
            return
        with torch.no_grad():  # vLLM loads with autograd on (its forward runs in inference mode)
            warm_moe(w, topk, hidden, tokens, fold, order, shift)
        if device.type == "cuda":  # a launch error shows here, at load (the interpreter, on the CPU, has run already)
            torch.cuda.synchronize(device)
        # no torch.cuda.empty_cache(): vLLM empties the cache before it profiles memory, and under its sleep mode the
        # load runs in a memory pool where emptying the cache is what it avoids (vllm/device_allocator/cumem.py)
        self.warmed.add(key)

    def get_fused_moe_quant_config(self, layer):
        return None  # no vLLM modular kernel: apply() calls mxrepack's kernels

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None, *args, **kwargs):
        from mxrepack.kernels.moe_mxfp4 import moe_mxfp4

        w = {name: getattr(layer, name) for name in self.spec.stored}
        return moe_mxfp4(
            x,
            topk_ids,
            topk_weights,
            w,
            fold_scale=layer.mxrepack_fold_scale,
            order=self.spec.strided_order,
            scale_shift=layer.mxrepack_scale_shift,
        )
