"""``--load-format mxrepack``: vLLM's default loader with :func:`mxrepack.serve.reader.read_tensors` as its reader.

Everything else is vLLM's: which files make the checkpoint (index, duplicates), the prefix, the weight loaders, the
process after loading. Any safetensors checkpoint loads through it, an mxrepack output or not; what differs is only how
the bytes reach the GPU (threads and page-locked staging instead of one thread and pageable memory). ``num_threads`` in
``--model-loader-extra-config`` sets the readers (default 8), as for vLLM's own multithreaded load.
"""

from __future__ import annotations

import time

LOAD_FORMAT = "mxrepack"
DEFAULT_THREADS = 8


def register() -> None:
    """Register the load format with vLLM (0.26 and 0.33: ``register_model_loader``, ``DefaultModelLoader``)."""
    import torch
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from mxrepack.serve.reader import read_tensors

    @register_model_loader(LOAD_FORMAT)
    class MxRepackModelLoader(DefaultModelLoader):
        def _prepare_weights(self, *args, **kwargs):
            # vLLM's own file discovery, as for --load-format safetensors (it knows no other name)
            load_format, self.load_config.load_format = self.load_config.load_format, "safetensors"
            try:
                return super()._prepare_weights(*args, **kwargs)
            finally:
                self.load_config.load_format = load_format

        def _get_weights_iterator(self, source):
            # 0.26 returns (folder, files, use_safetensors), 0.33 adds the index file
            files = self._prepare_weights(
                source.model_or_path,
                source.subfolder,
                source.revision,
                source.fall_back_to_pt,
                source.allow_patterns_overrides,
            )[1]
            threads = self.load_config.model_loader_extra_config.get("num_threads") or DEFAULT_THREADS
            if self.counter_before_loading_weights == 0.0:
                self.counter_before_loading_weights = time.perf_counter()
            # the worker's GPU (vLLM sets it before loading); host memory where there is none (vLLM's CPU build)
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
            # 0.33: weights the model does not load (vLLM drops a shard holding only those; here each is skipped)
            skip = getattr(source, "is_unused_weight", None)
            return ((source.prefix + name, t) for name, t in read_tensors(files, device, threads, skip=skip))
