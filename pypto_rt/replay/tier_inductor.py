"""Building the compiled tier's code with inductor (replay.tier's bodies, replay.tier_segments' runs): the traced
graph, inductor's settings, the settings to build once more with after a known bug of its C++ code generation, and
the check of what tracing assumed of the values carried as symbolic integers."""
from __future__ import annotations

import re
import traceback

from pypto_rt.replay.tier_copies import copy
from pypto_rt.replay.tier_graph import capturing, direct_call
from pypto_rt.replay.tier_passes import UNROLLED_WIDTH


def inductor_settings(threads: int) -> dict:
    """Inductor's settings for a tier build (replay.tier_segments' too). emulate_precision_casts: a cast to bf16/fp16
    and back rounds as eager torch does (inductor would keep fp32). size_asserts off: the generated code would
    check every input's sizes and strides on every call (~1 µs each, ~70 per MoE decode call), which a tier's
    inputs always have: it runs only where its replay's guards matched the arguments' sizes, strides, offsets and
    dtypes, and every other input is a tensor the replay made or keeps, of the layout recorded."""
    return {"fx_graph_cache": True, "compile_threads": 1, "cpp.threads": threads, "emulate_precision_casts": True,
            "size_asserts": False}


def narrow_settings(graph) -> dict:
    """Inductor settings for a graph where replay.tier_passes unrolled narrow products (`{}` where it did not):
    thresholds under which a chain of w gathered, weighted terms stays one loop. At inductor's CPU defaults (a
    pointwise value of more than 50 operations or 12 reads is stored) an 8-term sum is cut into stored pieces and its
    FP32 result written whole before its cast: an 8-rank prefill combine's sums [8192, 1024] took 24 ms against 7.9
    fused (the same bits). The thresholds below were bisected on that graph: 3 reads a term fell back to 24.8 ms, 4
    reads a term gave 9.4 and 20 operations a term 9.2."""
    width = graph.meta.get(UNROLLED_WIDTH, 0)
    if not width:
        return {}
    return {"realize_opcount_threshold": max(50, 40 * width), "realize_acc_reads_threshold": max(12, 8 * width)}


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


def build(fn, examples: list, values: tuple, threads: int, prepare, dynamic: dict | None = None,
          changes: dict | None = None):
    """(compile_fx's compiled function, inductor's direct call or None (replay.tier_graph), the check of what tracing
    and compiling assumed of `values` or None, what `prepare(traced graph)` gave): `fn` traced (`_trace`) and
    compiled with the tier's inductor settings (and `changes`); after a known bug of inductor's C++ code generation,
    once more avoiding it (`retry_settings`). `prepare` may rewrite the graph before the compile (replay.tier_passes)
    or raise to refuse it. `dynamic`: example index -> its dims traced as symbolic sizes (replay.tier_family); what
    was assumed of them is checked with the carried values'. In this process: replay.tier_process builds in a child
    (`artifact`) and calls this only for compile_fx's wrapped function, then from inductor's cache."""
    compiled, graph, found, code, prepared, _ = _attempts(fn, examples, values, threads, prepare, dynamic, changes)
    return compiled, direct_call(graph, found), assumptions(code, len(examples) + len(values)), prepared


def artifact(fn, examples: list, values: tuple, threads: int, prepare, dynamic: dict | None = None) -> dict:
    """`build` in the compile child: what the calling process needs to load the compiled code (`load`) rather than
    the code itself: the inductor setting changes a retry made, what `prepare` gave, the assumptions' source, and
    the generated module's cache key, path and constants where inductor's `call` may be called directly (else None:
    the caller builds compile_fx's wrapped function from the cache)."""
    _, graph, found, code, prepared, changes = _attempts(fn, examples, values, threads, prepare, dynamic, None)
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


def _attempts(fn, examples: list, values: tuple, threads: int, prepare, dynamic: dict | None, changes: dict | None):
    """(compiled, traced graph, [(AOT's graph, inductor's compiled code)], assumptions' source, what `prepare`
    gave, the setting changes used): a build, retried once after a known inductor bug."""
    from torch._functorch import config as functorch
    from torch._guards import TracingContext, tracing
    from torch._inductor import config as inductor
    from torch._inductor.compile_fx import compile_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    settings = inductor_settings(threads)

    symbolic = bool(values) or bool(dynamic)

    def attempt(changes: dict):
        # (inductor's FX-graph cache keys on a shape environment: as dynamo gives it, sizes static)
        shape_env = ShapeEnv(specialize_zero_one=False, duck_shape=False) if symbolic else ShapeEnv()
        fake = FakeTensorMode(shape_env=shape_env, static_shapes=True, allow_non_fake_inputs=symbolic)
        found = []   # (AOT's own cache off: a hit there skips the inner compile that tells the direct call)
        with inductor.patch({**settings, **changes}), functorch.patch(enable_autograd_cache=False), \
                tracing(TracingContext(fake)):
            graph, placeholders = _trace(fn, _sized(fake, examples, dynamic or {}), values, symbolic)
            prepared = prepare(graph)
            narrow = narrow_settings(graph)   # (kept with the changes: `load` finds the code under the same settings)
            with inductor.patch(narrow):
                compiled = compile_fx(graph, placeholders, inner_compile=capturing(found))
            code = _assumed(shape_env, placeholders) if symbolic else None
            return compiled, graph, found, code, prepared, {**changes, **narrow}
    if changes is not None:
        return attempt(changes)
    try:
        return attempt({})
    except Exception as e:   # noqa: BLE001 - bugs of inductor's C++ code generation: once more, avoiding them
        retry = retry_settings(e)
        if retry is None:
            raise
        return attempt(retry)


def _sized(fake, examples: list, dynamic: dict) -> list:
    """`examples` as fake tensors (all of them, so memory they share stays shared), the dims `dynamic` lists
    (example index -> dims) symbolic sizes; unchanged when none is. A view's base (a slice's whole buffer) keeps
    static sizes: else its sizes are symbols that no graph input carries, which the guards cannot name (an
    IndexError in produce_guards). Views are faked after the rest, so a base that is an example is faked as one."""
    from torch._dynamo.source import LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    if not dynamic:
        return examples
    out = list(examples)
    for k in sorted(range(len(examples)), key=lambda k: examples[k]._is_view()):
        t, dims = examples[k], dynamic.get(k, ())
        sizes = [DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(t.dim())]
        base = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC] * t._base.dim()) if t._is_view() else None
        out[k] = fake.from_tensor(t, static_shapes=False, source=LocalSource(f"t{k}"),
                                  symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes,
                                                                            view_base_context=base))
    return out


def _trace(body, examples: list, values: tuple, symbolic: bool):
    """(aten graph of `body`, its example inputs for the compiler). Tensors keep static sizes but for the dims
    made symbolic (`_sized`); the values carried from the prologue are traced as symbolic integers (none
    specialised for being 0 or 1 or equal to another), so the graph serves any offsets, slots or expert ids
    without recompiling."""
    from torch.fx.experimental.proxy_tensor import make_fx

    if not symbolic:
        return make_fx(body)(*copy(examples)), examples
    graph = make_fx(body, tracing_mode="symbolic")(*examples, *values)
    return graph, [n.meta["val"] for n in graph.graph.nodes if n.op == "placeholder"]


_OFFSET = re.compile(r"L\['(t\d+)'\]\.storage_offset\(\)")


def _assumed(shape_env, placeholders: list) -> str | None:
    """The source of what tracing and compiling assumed of the carried values and the sizes traced as symbolic
    (ranges, relations, a value fixed; its inputs named t0..tN as produce_guards_expression names them), or None
    when nothing was. Asked after the compile: inductor's lowering may assume more. Left out: bounds on one
    tensor's storage offset, which say that the example call's tensor fits in its example memory (each call's own
    tensors fit in theirs; a specialisation's offsets are its own, the family's the same). Kept: those relating two
    tensors' offsets, that inputs sharing memory do not overlap (a family's larger size may make them overlap)."""
    from torch._dynamo.source import LocalSource

    if not shape_env.backed_var_to_val:
        return None
    names = [f"t{i}" for i in range(len(placeholders))]
    guards = [g for g in shape_env.produce_guards(placeholders, [LocalSource(n) for n in names], ignore_static=True)
              if len(set(_OFFSET.findall(g))) != 1]
    return " and ".join(guards) or None


def assumptions(code: str | None, inputs: int):
    """`(graph inputs) -> bool`: whether the carried values and the symbolic sizes meet what tracing and compiling
    assumed of them (`code` from `_assumed`, on a graph of `inputs` inputs), or None when nothing was assumed."""
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    if code is None:
        return None
    check = compile(code, "<pypto-rt tier assumptions>", "eval")
    names = [f"t{i}" for i in range(inputs)]   # (as `_assumed` names them)
    return lambda graph_inputs: eval(check, SYMPY_INTERP, {"L": dict(zip(names, graph_inputs))})
