"""`import pypto.language.distributed as pld` — pypto-rt's `pld` surface (see pypto_rt.language.distributed)."""
from pypto_rt.language.distributed import *  # noqa: F401,F403
from pypto_rt.language.distributed import __all__  # noqa: F401
