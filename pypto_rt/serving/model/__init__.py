"""A small MoE decoder built only from pypto-rt kernels (issue 15), and its single-process torch golden."""
from pypto_rt.serving.model.config import DecoderConfig, random_state_dict
from pypto_rt.serving.model.decoder import MoEDecoder
from pypto_rt.serving.model.decoder_errors import DecoderConfigError, DecoderError
from pypto_rt.serving.model.golden import GoldenDecoder

__all__ = ["DecoderConfig", "DecoderConfigError", "random_state_dict", "MoEDecoder", "DecoderError",
           "GoldenDecoder"]
