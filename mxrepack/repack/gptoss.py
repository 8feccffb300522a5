"""Moved to :mod:`mxrepack.gptoss` (the gpt-oss schema is shared by layouts, eval and repack).

Kept for one release so that code importing ``mxrepack.repack.gptoss`` keeps working; import from
``mxrepack.gptoss`` instead.
"""

from mxrepack.gptoss import (  # noqa: F401
    EXPERT_PARTS,
    KIND_DTYPES,
    NATIVE_QUANTIZATION_CONFIG,
    SIDE_FILES,
    Dims,
    canonical_to_original,
    component,
    expected_tensors,
    hf_config_from_original,
    original_to_canonical,
)
