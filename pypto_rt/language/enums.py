"""Enumerations of the `pl` surface: levels, split modes, pad values, memory spaces, ..."""
from __future__ import annotations

import enum

__all__ = [
    "Level", "SplitMode", "PadValue", "MemorySpace", "Mem", "AtomicType", "FunctionType", "Role",
    "TensorLayout", "ND", "DN", "NZ", "MX_A_ZZ", "MX_B_NN", "MaskPattern", "ScopeMode", "CastMode",
    "NotifyOp", "WaitCmp", "ReduceOp",
]


class Level(enum.Enum):
    """Hierarchy level of a `pl.at` scope; `CORE_GROUP` marks an InCore region."""
    AIV = 0
    AIC = 1
    CORE_GROUP = 2
    CHIP_DIE = 3
    CHIP = 4
    HOST = 5
    CLUSTER_0 = 6
    CLUSTER_1 = 7
    CLUSTER_2 = 8
    GLOBAL = 9


class SplitMode(enum.IntEnum):
    """Cube/vector split of a mixed region."""
    NONE = 0
    UP_DOWN = 1
    LEFT_RIGHT = 2


class PadValue(enum.Enum):
    """What fills the part of a tile outside its valid box."""
    null = 0
    zero = 1
    max = 2
    min = 3


class MemorySpace(enum.Enum):
    """On-chip memory spaces; moves between them are identities on the CPU."""
    DDR = 0
    Vec = 1
    Mat = 2
    Left = 3
    Right = 4
    Acc = 5
    Bias = 6
    ScaleLeft = 7
    ScaleRight = 8


Mem = MemorySpace


class AtomicType(enum.IntEnum):
    """Write mode of assemble/store/remote_store: overwrite or accumulate."""
    None_ = 0
    Add = 1


class FunctionType(enum.Enum):
    """Kind of a `@pl.function`."""
    Opaque = 0
    Orchestration = 1
    InCore = 2
    AIC = 3
    AIV = 4
    Group = 5
    Spmd = 6
    Inline = 7
    Graph = 8


class Role(enum.Enum):
    Orchestrator = 0
    SubWorker = 1


class TensorLayout(enum.Enum):
    ND = 0
    DN = 1
    NZ = 2
    MX_A_ZZ = 3
    MX_B_NN = 4


ND = TensorLayout.ND
DN = TensorLayout.DN
NZ = TensorLayout.NZ
MX_A_ZZ = TensorLayout.MX_A_ZZ
MX_B_NN = TensorLayout.MX_B_NN


class MaskPattern(enum.IntEnum):
    """Column-selection patterns of mask-form gather/scatter (bit k set = column k mod 4 kept)."""
    P0101 = 1
    P1010 = 2
    P0001 = 3
    P0010 = 4
    P0100 = 5
    P1000 = 6
    P1111 = 7


class ScopeMode(enum.Enum):
    AUTO = 0
    MANUAL = 1


class CastMode(enum.IntEnum):
    """Rounding mode of `pl.cast`; names are also accepted as strings."""
    none = 0
    rint = 1
    round = 2
    floor = 3
    ceil = 4
    trunc = 5
    odd = 6


class NotifyOp(enum.Enum):
    AtomicAdd = 0
    Set = 1


class WaitCmp(enum.Enum):
    Eq = 0
    Ge = 1


class ReduceOp(enum.Enum):
    Sum = 0
    Max = 1
    Min = 2
