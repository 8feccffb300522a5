"""``--load-format mxrepack``: vLLM's default loader with :func:`mxrepack.serve.reader.read_tensors` as its reader.

Everything else is vLLM's: which files make the checkpoint (index, duplicates), the prefix, the weight loaders, the
process after loading. What differs is only how the bytes reach the GPU (threads and page-locked staging instead of one
thread and pageable memory). ``num_threads`` in ``--model-loader-extra-config`` sets the readers (vLLM's default for
its own multithreaded load, 8). Where vLLM's reader would do more than read every tensor of local safetensors files --
``.bin``/``.pt`` weights, a ``safetensors_load_strategy`` (``torchao`` included), expert parallelism's per-rank expert
filter, 0.33's filters of unused weights and of encoder-only shards -- the load goes through vLLM's reader unchanged.
"""

from __future__ import annotations

import time

LOAD_FORMAT = "mxrepack"


def register() -> None:
    """Register the load format with vLLM (0.26 and 0.33: ``register_model_loader``, ``DefaultModelLoader``)."""
    import torch
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from mxrepack.serve.reader import read_tensors

    @register_model_loader(LOAD_FORMAT)
    class MxRepackModelLoader(DefaultModelLoader):
        def _prepare_weights(self, *args, **kwargs):
            # vLLM's own file discovery, as for --load-format safetensors (the only name it takes for it); the
            # shared config says "safetensors" only for the length of the call
            load_format, self.load_config.load_format = self.load_config.load_format, "safetensors"
            try:
                return super()._prepare_weights(*args, **kwargs)
            finally:
                self.load_config.load_format = load_format

        def _vllm_reads(self, source) -> bool:
            """The load needs more of vLLM's reader than reading every tensor of safetensors files."""
            return (
                self.load_config.safetensors_load_strategy not in (None, "lazy")
                or bool(getattr(self, "local_expert_ids", None))  # expert parallelism: this rank's experts only
                or getattr(source, "is_unused_weight", None) is not None  # 0.33
                or getattr(self, "_encoder_only_lm_prefixes", None) is not None  # 0.33
            )

        def _get_weights_iterator(self, source):
            if self._vllm_reads(source):  # decided before file discovery, which vLLM's iterator does itself
                return super()._get_weights_iterator(source)
            # 0.26 answers (folder, files, use_safetensors), 0.33 adds the index file
            _, files, use_safetensors, *_ = self._prepare_weights(
                source.model_or_path,
                source.subfolder,
                source.revision,
                source.fall_back_to_pt,
                source.allow_patterns_overrides,
            )
            if not use_safetensors:  # .bin / .pt weights
                return super()._get_weights_iterator(source)
            threads = self.load_config.model_loader_extra_config.get("num_threads") or self.DEFAULT_NUM_THREADS
            if self.counter_before_loading_weights == 0.0:
                self.counter_before_loading_weights = time.perf_counter()
            # the worker's GPU (vLLM sets it before loading); host memory where there is none (vLLM's CPU build)
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
            return ((source.prefix + name, t) for name, t in read_tensors(files, device, threads))
