"""The vLLM plugin: serves mxrepack's GPU targets (``quant_method: mxrepack``) with no load-time repack.

vLLM finds :func:`register` through the ``vllm.general_plugins`` entry point (pyproject) and calls it in every process
it starts. Importing this package imports no vLLM; :func:`register` does.

What it registers (:mod:`.config`): the ``mxrepack`` quantization method, whose expert methods (:mod:`.moe`) create
parameters in the stored shapes, load the bytes as stored and hand them to the vLLM kernel the layout was written for
(or to mxrepack's own kernels for ``strided``); the dense MXFP4 layers go to vLLM's Marlin MXFP4 linear
(:mod:`.linear`); and gpt-oss's model class (:mod:`.model`), extended to route the stored expert tensors past vLLM's
gpt-oss loader (which would transpose them) and to build a quantized lm_head. Checkpoints of any other quantization load
exactly as before.
"""

from __future__ import annotations


def register() -> None:
    """The ``vllm.general_plugins`` entry point; safe to call more than once."""
    from mxrepack.serve.vllm import config

    config.register()
