"""pypto-rt's stand-in for the `pypto` package: `pypto.language` and friends, run on the CPU.

It cannot share an environment with the real PyPTO compiler, which owns the same name. Importing a
`pypto.*` module it does not provide (`pypto.runtime`, `pypto.backend`, ...) raises a RealPyptoOnlyError
saying so at the importing line, for `pypto-run` and plain `python` alike.
"""
import sys

__pypto_rt_shim__ = True


class _RealPyptoOnly:
    """Last on sys.meta_path: a `pypto.*` module no other finder found is one only the real PyPTO stack has."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if not name.startswith(__name__ + "."):
            return None
        from pypto_rt.errors import RealPyptoOnlyError, user_span
        if name.startswith(__name__ + ".language."):
            message = (f"pypto-rt does not provide `{name}`; it provides `pypto.language` (`import pypto.language "
                       "as pl`) and `pypto.language.distributed`")
            hint = "use the names `pl` and `pld` export"
        else:
            message = (f"`{name}` belongs to the real PyPTO runtime (compiling and running kernels on an Ascend "
                       "NPU or its simulator, with the NPU toolchain); pypto-rt provides `pypto.language` only, "
                       "so this file needs the real PyPTO stack")
            hint = "run it where the real PyPTO compiler and runtime are installed (not in pypto-rt's environment)"
        raise RealPyptoOnlyError(message, user_span(), hint)


sys.meta_path.append(_RealPyptoOnly)
