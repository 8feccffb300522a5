"""The ``mxrepack`` quantization method for vLLM: which method serves which layer of an mxrepack checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

from mxrepack.errors import MxRepackError
from mxrepack.serve.spec import (
    DENSE_KERNEL_DEFAULT,
    QUANT_METHOD,
    ServeSpec,
    check_checkpoint,
    check_vllm_version,
    chosen_dense_kernel,
    hub_snapshot_identity,
    weights_identity,
)


def vllm_version() -> str:
    """The installed vLLM's version string."""
    from vllm.version import __version__

    return __version__


def vllm_minor() -> tuple[int, int]:
    """The installed vLLM's (major, minor)."""
    major, minor = vllm_version().split(".")[:2]
    return int(major), int(minor)


class MxRepackConfig(QuantizationConfig):
    """An mxrepack output's ``quantization_config`` (:class:`~mxrepack.serve.spec.ServeSpec`) as vLLM's quant config."""

    def __init__(self, spec: ServeSpec, dense_kernel: str = DENSE_KERNEL_DEFAULT):
        super().__init__()
        self.spec = spec
        self.dense_prefixes = spec.quantized_vllm_prefixes()
        self.dense_kernel = dense_kernel  # chosen once, here; travels to the workers with this object

    @classmethod
    def get_name(cls) -> str:
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 80  # Marlin; each expert layout's own minimum is checked when its method is built

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict) -> MxRepackConfig:
        """vLLM's constructor from ``quantization_config`` alone: refuses a vLLM outside the tested range, and parses
        the spec with placeholder dimensions (:meth:`maybe_update_config` brings the real ones)."""
        check_vllm_version(vllm_version())
        # vLLM hands over quantization_config alone; the dimensions the spec needs come with the model's hf_config
        # in maybe_update_config, so parse what needs no dimensions now and refine there.
        dims = {"hidden_size": 0, "intermediate_size": 0}
        return cls(ServeSpec.from_config({**dims, "quantization_config": config}), chosen_dense_kernel(config))

    def maybe_update_config(self, model_name: str, hf_config=None, *args, **kwargs) -> None:
        """Runs in the first process, before any GPU memory is taken: the real dimensions, and for a local checkpoint
        every stored tensor's dtype and shape against the config (one line naming the first that differs)."""
        if hf_config is not None:
            self.spec = ServeSpec.from_config(hf_config.to_dict())
            self.dense_prefixes = self.spec.quantized_vllm_prefixes()
        if Path(model_name).is_dir():
            check_checkpoint(model_name, self.spec)
        qc = getattr(hf_config, "quantization_config", None)
        if isinstance(qc, dict) and (self.dense_prefixes or self.spec.lm_head_quantized):
            # recorded where vLLM hashes it for its torch.compile cache (hf_config is part of the model config's
            # hash; a graph compiled for one dense kernel calls that kernel's op on its parameters, and was loaded
            # from the cache for the other: "KeyError: 'weight'", vLLM 0.26, H100), and where a worker that rebuilds
            # this config reads it (chosen_dense_kernel)
            qc["dense_kernel"] = self.dense_kernel
            # and the weights, whose fold flags a cached graph keeps: a folder's files (weights_identity), a Hub id's
            # snapshot (hub_snapshot_identity)
            if Path(model_name).is_dir():
                qc["mxrepack_weights"] = weights_identity(model_name)
            else:
                commit = getattr(hf_config, "_commit_hash", None)
                snapshot = hub_snapshot_identity(model_name, kwargs.get("revision"), commit)
                if snapshot is not None:
                    qc["mxrepack_weights"] = snapshot

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        """The method for one layer: the experts' stored-layout method (:func:`.moe.make_moe_method`); for the dense
        layers (and lm_head) the checkpoint stores as MXFP4, in the rows order the kernel chosen when this config was
        built (``$MXREPACK_DENSE_KERNEL``: vLLM's Marlin by default), in a chunk order mxrepack's chunk tiles
        (:func:`.linear.make_dense_method`); unquantized for every other linear; None (vLLM's default) for anything
        else. A layer that would be sharded across GPUs is refused in one line."""
        if isinstance(layer, RoutedExperts):
            from mxrepack.serve.vllm.moe import make_moe_method

            check_single_shard(layer, prefix)
            return make_moe_method(self.spec, layer.moe_config)
        if isinstance(layer, ParallelLMHead):
            if prefix.endswith("lm_head") and self.spec.lm_head_quantized:
                from mxrepack.serve.vllm.linear import make_dense_method

                check_single_shard(layer, prefix)
                return make_dense_method(self.dense_kernel, self.spec.dense_order)
            return None
        if isinstance(layer, LinearBase):
            if prefix in self.dense_prefixes:
                from mxrepack.serve.vllm.linear import make_dense_method

                check_single_shard(layer, prefix)
                return make_dense_method(self.dense_kernel, self.spec.dense_order)
            return UnquantizedLinearMethod()
        return None


def check_single_shard(layer: torch.nn.Module, prefix: str) -> None:
    """The stored bytes are whole-layer kernel layouts (Marlin tiles, swizzled scales): a shard of them is not a slice.
    One line instead of a wrong model."""
    from vllm.distributed import get_tensor_model_parallel_world_size

    parallel = getattr(getattr(layer, "moe_config", None), "moe_parallel_config", None)
    if parallel is not None:
        split = parallel.tp_size != 1 or parallel.ep_size != 1 or parallel.use_ep
    else:
        split = get_tensor_model_parallel_world_size() != 1
    if split:
        raise MxRepackError(
            f"{prefix}: the mxrepack plugin serves each layer whole (stored kernel layouts are not "
            "sliceable; its compressed-tensors expert loader is single-GPU); serve it on one GPU "
            "(tensor/data/expert parallel size 1); --pipeline-parallel-size works"
        )


def register() -> None:
    """Register the ``mxrepack`` quantization method, and (on a vLLM in the tested range) the ``mxrepack`` load format
    (:mod:`~mxrepack.serve.vllm.loader`) and the gpt-oss model class
    :class:`~mxrepack.serve.vllm.model.MxRepackGptOssForCausalLM` under vLLM's own architecture name."""
    register_quantization_config(QUANT_METHOD)(MxRepackConfig)
    try:
        check_vllm_version(vllm_version())
    except MxRepackError:
        return  # from_config refuses an mxrepack checkpoint in one line; nothing else is touched
    from vllm import ModelRegistry

    from mxrepack.serve.vllm import loader

    loader.register()

    # Same architecture name: vLLM's per-architecture defaults (reasoning parser, graph sizes) still apply, and a
    # checkpoint of any other quantization takes the parent's code paths unchanged.
    ModelRegistry.register_model("GptOssForCausalLM", "mxrepack.serve.vllm.model:MxRepackGptOssForCausalLM")
