"""Import-compatibility stand-ins for `pypto.ir` modules that kernel files import."""
