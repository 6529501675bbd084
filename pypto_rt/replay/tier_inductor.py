"""Inductor's settings for the compiled tier's builds (replay.tier, replay.tier_segments), and the settings to build
once more with after a known bug of inductor's C++ code generation."""
from __future__ import annotations

import traceback


def inductor_settings(threads: int) -> dict:
    """Inductor's settings for a tier build (replay.tier_segments' too). emulate_precision_casts: a cast to bf16/fp16
    and back rounds as eager torch does (inductor would keep fp32)."""
    return {"fx_graph_cache": True, "compile_threads": 1, "cpp.threads": threads, "emulate_precision_casts": True}


def retry_settings(e: Exception) -> dict | None:
    """Inductor settings to compile once more with after `e`, or None: a C++ compile error is a bug of its vector
    code generation (as scalar C++); a KeyError from the C++ scheduler's outer-loop fusion with a local buffer
    (torch 2.13 asks a buffer's users for their load of it, and a user that writes it has none: seen on an RMSNorm
    writing its residual in place) compiles without fusing (the trial then times it against the replay)."""
    if "CppCompileError" in f"{type(e).__name__} {e}"[:300]:
        return {"cpp.simdlen": 1}
    inner = getattr(e, "inner_exception", e)
    if isinstance(inner, KeyError) and any(frame.name == "try_outer_loop_fusion_with_local_buf"
                                           for frame in traceback.extract_tb(inner.__traceback__)):
        return {"max_fusion_size": 1}
    return None
