"""Error metrics between a reference tensor and a candidate (quantized, repacked, kernel output)."""

from __future__ import annotations

import math

import torch


def tensor_error(reference: torch.Tensor, candidate: torch.Tensor) -> dict[str, float]:
    """Relative Frobenius error ``‖c − r‖/‖r‖``, SQNR in dB, and max absolute error (fp64 sums)."""
    r = reference.to(torch.float64)
    diff = candidate.to(torch.float64) - r
    signal, noise = float(r.square().sum()), float(diff.square().sum())
    return {
        "rel_fro": math.sqrt(noise / signal) if signal else (0.0 if noise == 0 else math.inf),
        "sqnr_db": 10 * math.log10(signal / noise) if noise else math.inf,
        "max_abs": float(diff.abs().max()) if diff.numel() else 0.0,
    }
