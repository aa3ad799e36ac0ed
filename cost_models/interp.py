"""Interpolation in log2 of the abscissa, the shape the kernel and collective tables are read in
(their points are powers of two: sequence lengths, message sizes, node counts)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def log2_interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Linear in log2(x) between the points (xs ascending), flat beyond the last. Below the first
    point each caller has its own rule, so x < xs[0] is not handled here."""
    assert x >= xs[0], (x, xs[0])
    if x >= xs[-1]:
        return ys[-1]
    for i in range(len(xs) - 1):
        if x <= xs[i + 1]:
            w = math.log2(x / xs[i]) / math.log2(xs[i + 1] / xs[i])
            return ys[i] + w * (ys[i + 1] - ys[i])
    return ys[-1]
