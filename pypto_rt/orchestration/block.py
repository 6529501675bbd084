"""One block of a compiled kernel, run on the calling thread with its errors placed at the user's line."""
from __future__ import annotations

from pypto_rt.errors import OpError, PyptoError, is_internal_file, span_from_traceback
from pypto_rt.incore_compiler.kernel_executor import KernelExecutor
from pypto_rt.language._runtime import activate


def run_block(binding, fn, inputs, block, nblocks):
    """`fn(block, *inputs)` (a kernel's run function) with the kernel executor of that block active."""
    try:
        with activate(KernelExecutor(binding, block, nblocks)):
            return fn(block, *inputs)
    except PyptoError as e:
        raise e.at(span_from_traceback(e.__traceback__))
    except Exception as e:  # noqa: BLE001 - a torch error inside an op: name the op and the user's line
        raise OpError(f"{_failing_op(e.__traceback__)} failed: {type(e).__name__}: {e}",
                      span_from_traceback(e.__traceback__)) from e


def _failing_op(tb) -> str:
    """`pl.<op>` for the first op-library frame under the innermost user frame of a traceback."""
    name = None
    after_user = False
    while tb is not None:
        internal = is_internal_file(tb.tb_frame.f_code.co_filename)
        if not internal:
            after_user, name = True, None
        elif after_user and name is None:
            name = tb.tb_frame.f_code.co_name.rstrip("_")
        tb = tb.tb_next
    return f"pl.{name}" if name else "the kernel"
