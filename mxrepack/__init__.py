"""mxrepack: offline repacking of gpt-oss MXFP4 checkpoints into per-GPU kernel layouts."""

__version__ = "0.2.0"

from mxrepack.errors import MxRepackError  # noqa: E402

__all__ = ["MxRepackError", "__version__"]
