"""What the kernel libraries share about dtypes: the torch -> pl dtype map and inline tile conversions."""
import torch

import pypto.language as pl

PL_DTYPES = {torch.bfloat16: pl.BF16, torch.float16: pl.FP16, torch.float32: pl.FP32}


@pl.jit.inline
def identity(tile):
    return tile


def cast_to(source, target):
    """An inline `tile of source dtype -> target dtype`, rounding to nearest even (the identity when they are the
    same: a same-dtype cast is an error on the device)."""
    if source == target:
        return identity

    @pl.jit.inline
    def converted(tile):
        return pl.cast(tile, target_type=target, mode="rint")

    return converted
