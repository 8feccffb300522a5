"""Serving what mxrepack writes: the vLLM plugin (:mod:`mxrepack.serve.vllm`) and the facts it works from
(:mod:`mxrepack.serve.spec`), which need no engine installed."""
