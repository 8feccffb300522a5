"""Evaluation: numerics of tensors and layers now; model-level KL and GPQA harness build on it."""

from mxrepack.eval.numerics import tensor_error

__all__ = ["tensor_error"]
