"""`import pypto.language as pl` — pypto-rt's `pl` surface (see pypto_rt.language)."""
from pypto_rt.language import *  # noqa: F401,F403
from pypto_rt.language import __all__, __dir__, __getattr__  # noqa: F401
