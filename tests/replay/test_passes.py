"""Passes over recorded calls: they work on Call records (tokens), never on generated text.

What users depend on: a call repeated over unchanged memory runs once in the replay, and the calls that use its
result are renamed by their tensor tokens only (a string argument that happens to spell a name stays as it is)."""
from __future__ import annotations

from pypto_rt.replay.passes import _dedupe
from pypto_rt.replay.records import Call, Ref, text


def call(out, fn, *args):
    code = (fn, "(") + tuple(t for i, a in enumerate(args) for t in ((", ",) if i else ()) + (a,)) + (")",)
    return Call(code, [a for a in args if type(a) is Ref], False, out=out)


def test_a_repeated_call_is_shared_and_its_users_renamed_by_token():
    calls = [call("v1", "exp_0", Ref("a0")), call("v2", "exp_0", Ref("a0")),
             call("v3", "pad_1", Ref("v2"), "'v2'")]   # a string argument spelling the shared name
    storage = {"a0": 1, "v1": 2, "v2": 3, "v3": 4}
    kept = _dedupe(calls, storage)
    assert [c.out for c in kept] == ["v1", "v3"]
    assert text(kept[1].code) == "pad_1(v1, 'v2')" and kept[1].reads == ["v1"]


def test_each_temporary_is_released_after_its_last_use_but_never_a_result():
    from pypto_rt.replay.passes import _with_releases
    calls = [call("v1", "exp_0", Ref("a0")), call("v2", "mul_1", Ref("v1"), Ref("a0")),
             call("v3", "add_2", Ref("v2"), Ref("v1")), call("v4", "neg_3", Ref("v3"))]
    body = _with_releases(calls, {"v1", "v2", "v3"})   # v4 is returned: not among the tensors to release
    assert body == ["v1 = exp_0(a0)", "v2 = mul_1(v1, a0)", "v3 = add_2(v2, v1)", "del v1, v2",
                    "v4 = neg_3(v3)", "del v3"], body
