"""What a recording holds: each torch call as a `Call` record whose code is a tuple of tokens, so passes rename and
inspect names without reading text back; Python source is made from them only at the end (`text`)."""
from __future__ import annotations

from dataclasses import dataclass, field


class Ref(str):
    """A tensor's name in recorded code (`a0`, `v7`, `t3`, `k2`): the token passes rename (a shared result)."""
    __slots__ = ()


class Sym(str):
    """Code of a number read from data or a parameter (`s3`, `(s3 + 1)`): names, never renamed."""
    __slots__ = ()


class Lit(str):
    """The name of a literal constant (an index tuple or slice built once, `k5`): listed in the replay's comments."""
    __slots__ = ()


Code = tuple   # of str tokens, some of them Ref, Sym or Lit


def has_names(code: Code) -> bool:
    """Whether `code` uses a tensor or a number that differs between replays (it cannot be built once)."""
    return any(type(token) is Ref or type(token) is Sym for token in code)


def text(code: Code) -> str:
    return "".join(code)


def joined(parts: list[Code], separator: str = ", ") -> Code:
    """The codes in `parts` one after another, `separator` between them."""
    out: list = []
    for i, part in enumerate(parts):
        if i:
            out.append(separator)
        out.extend(part)
    return tuple(out)


@dataclass(eq=False, slots=True)
class Call:
    """One recorded call: `out = code`, or `code` alone (an effect with no new tensor, or a subscript assignment).
    `reads`: the tensors its arguments name, in order; `written` (names) and `written_storages`: what a mutating
    call writes; `effect`: it must run even if nothing needs its result (it writes, or draws random numbers)."""
    code: Code
    reads: list[str]
    effect: bool
    written: list[str] = field(default_factory=list)
    written_storages: list[int] = field(default_factory=list)
    out: str | None = None
    kind: str = ""         # "window": `code` is `t[key]` (a view); "copy": `copy_(dst, src)` (see assign_windows);
    #                        "parts": a pure call returning a tuple (its parts are lines `t[i]`); "check": an assert;
    #                        "number": a number read from data the run computed (`s3 = v9[(0, 0)].item()`)
    fresh: bool = False    # the result has memory of its own (not a view of an argument)
    tainted: bool = True   # the result may depend on an entry tensor, an outside tensor or chance
    whole: bool = False    # a window at constant bounds covering its tensor (same sizes, strides and offset)

    def renamed(self, alias: dict[str, str]) -> None:
        """Use `alias[name]` for each tensor name that has one (a result shared with an earlier call)."""
        self.code = tuple(Ref(alias.get(t, t)) if type(t) is Ref else t for t in self.code)
        self.reads = [alias.get(r, r) for r in self.reads]

    def statement(self) -> str:
        return f"{self.out} = {text(self.code)}" if self.out else text(self.code)
