"""Building the compiled tier's code with inductor (replay.tier's bodies, replay.tier_segments' runs): the traced
graph, inductor's settings, the settings to build once more with after a known bug of its C++ code generation, and
the check of what tracing assumed of the values carried as symbolic integers."""
from __future__ import annotations

import traceback

from pypto_rt.replay.tier_graph import capturing, direct_call


def inductor_settings(threads: int) -> dict:
    """Inductor's settings for a tier build (replay.tier_segments' too). emulate_precision_casts: a cast to bf16/fp16
    and back rounds as eager torch does (inductor would keep fp32). size_asserts off: the generated code would
    check every input's sizes and strides on every call (~1 µs each, ~70 per MoE decode call), which a tier's
    inputs always have: it runs only where its replay's guards matched the arguments' sizes, strides, offsets and
    dtypes, and every other input is a tensor the replay made or keeps, of the layout recorded."""
    return {"fx_graph_cache": True, "compile_threads": 1, "cpp.threads": threads, "emulate_precision_casts": True,
            "size_asserts": False}


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


def build(fn, examples: list, values: tuple, threads: int, prepare, changes: dict | None = None):
    """(compile_fx's compiled function, inductor's direct call or None (replay.tier_graph), the check of what tracing
    and compiling assumed of `values` or None, what `prepare(traced graph)` gave): `fn` traced (`_trace`) and
    compiled with the tier's inductor settings (and `changes`); after a known bug of inductor's C++ code generation,
    once more avoiding it (`retry_settings`). `prepare` may rewrite the graph before the compile (replay.tier_passes)
    or raise to refuse it. In this process: replay.tier_process builds in a child (`artifact`) and calls this only
    for compile_fx's wrapped function, then from inductor's cache."""
    compiled, graph, found, code, prepared, _ = _attempts(fn, examples, values, threads, prepare, changes)
    return compiled, direct_call(graph, found), assumptions(code, len(examples) + len(values)), prepared


def artifact(fn, examples: list, values: tuple, threads: int, prepare) -> dict:
    """`build` in the compile child: what the calling process needs to load the compiled code (`load`) rather than
    the code itself: the inductor setting changes a retry made, what `prepare` gave, the assumptions' source, and
    the generated module's cache key, path and constants where inductor's `call` may be called directly (else None:
    the caller builds compile_fx's wrapped function from the cache)."""
    _, graph, found, code, prepared, changes = _attempts(fn, examples, values, threads, prepare, None)
    module = None
    call = getattr(found[0][1], "current_callable", None) if len(found) == 1 else None
    scope = getattr(call, "__globals__", {})
    if direct_call(graph, found) is not None and getattr(call, "__name__", "") == "call" and "__file__" in scope \
            and not getattr(found[0][1], "opaque_value_type_classes", None):
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        compiled = found[0][1]
        module = {"key": compiled.cache_key, "path": scope["__file__"], "constants": dict(compiled.constants or {}),
                  "vec_isa_ok": bool(pick_vec_isa())}
    return {"changes": changes, "prepared": prepared, "assumptions": code, "module": module}


def load(module: dict, threads: int, changes: dict):
    """`(list of inputs) -> outputs`: the generated module `artifact` described, loaded here (its C++ from
    inductor's cache on disk, where the child put it), called as `direct_call` calls it. Under the child's settings
    and its verdict on the CPU's vector instructions: inductor decides that by building and loading a probe, which
    on a loaded machine can time out in one process and not the other (then this process looked for C++ built
    without them, and built it: `'at::vec' has not been declared`)."""
    from torch._inductor import config as inductor
    from torch._inductor.codecache import PyCodeCache

    settings = {**inductor_settings(threads), **changes, "cpp.vec_isa_ok": module["vec_isa_ok"]}
    with inductor.patch(settings):   # (so the C++ is found under the key the child stored it at)
        loaded = PyCodeCache.load_by_key_path(module["key"], module["path"], attrs=module["constants"] or None)
    call = loaded.call
    return lambda inputs: call(inputs)


def _attempts(fn, examples: list, values: tuple, threads: int, prepare, changes: dict | None):
    """(compiled, traced graph, [(AOT's graph, inductor's compiled code)], assumptions' source, what `prepare`
    gave, the setting changes used): a build, retried once after a known inductor bug."""
    from torch._functorch import config as functorch
    from torch._guards import TracingContext, tracing
    from torch._inductor import config as inductor
    from torch._inductor.compile_fx import compile_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    settings = inductor_settings(threads)

    def attempt(changes: dict):
        # (inductor's FX-graph cache keys on a shape environment: as dynamo gives it, sizes static)
        shape_env = ShapeEnv(specialize_zero_one=False, duck_shape=False) if values else ShapeEnv()
        fake = FakeTensorMode(shape_env=shape_env, static_shapes=True, allow_non_fake_inputs=bool(values))
        found = []   # (AOT's own cache off: a hit there skips the inner compile that tells the direct call)
        with inductor.patch({**settings, **changes}), functorch.patch(enable_autograd_cache=False), \
                tracing(TracingContext(fake)):
            graph, placeholders = _trace(fn, examples, values)
            prepared = prepare(graph)
            compiled = compile_fx(graph, placeholders, inner_compile=capturing(found))
            code = _assumed(shape_env, placeholders) if values else None
            return compiled, graph, found, code, prepared, changes
    if changes is not None:
        return attempt(changes)
    try:
        return attempt({})
    except Exception as e:   # noqa: BLE001 - bugs of inductor's C++ code generation: once more, avoiding them
        retry = retry_settings(e)
        if retry is None:
            raise
        return attempt(retry)


def _trace(body, examples: list, values: tuple):
    """(aten graph of `body`, its example inputs for the compiler). Tensors keep static sizes; the values carried
    from the prologue are traced as symbolic integers (none specialised for being 0 or 1 or equal to another), so
    the graph serves any offsets, slots or expert ids without recompiling."""
    from torch.fx.experimental.proxy_tensor import make_fx

    if not values:
        from pypto_rt.replay.tier import _copy   # (tier imports this module)

        return make_fx(body)(*_copy(examples)), examples
    graph = make_fx(body, tracing_mode="symbolic")(*examples, *values)
    return graph, [n.meta["val"] for n in graph.graph.nodes if n.op == "placeholder"]


def _assumed(shape_env, placeholders: list) -> str | None:
    """The source of what tracing and compiling assumed of the carried values, or None when nothing was. Asked
    after the compile: inductor's lowering may assume more."""
    return shape_env.produce_guards_expression(placeholders) if shape_env.backed_var_to_val else None


def assumptions(code: str | None, inputs: int):
    """`(graph inputs) -> bool`: whether the carried values meet what tracing and compiling assumed of them
    (ranges, relations, a value fixed; `code` from `_assumed`, on a graph of `inputs` inputs), or None when nothing
    was assumed."""
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    if code is None:
        return None
    check = compile(code, "<pypto-rt tier assumptions>", "eval")
    names = [f"t{i}" for i in range(inputs)]   # (as produce_guards_expression names them)
    return lambda graph_inputs: eval(check, SYMPY_INTERP, {"L": dict(zip(names, graph_inputs))})
