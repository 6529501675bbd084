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
def test_a_repeated_pure_tuple_call_is_shared_with_its_parts():
    """Two scatters over one index sort it twice: the second sort (a tuple) and its parts reuse the first."""
    def sort(out):
        line = call(out, "sort_0", Ref("a0"))
        line.kind, line.effect = "parts", True          # as the recorder marks a pure call returning a tuple
        return line

    def part(out, whole, i):
        return Call((Ref(whole), f"[{i}]"), [whole], False, out=out)

    calls = [sort("t1"), part("v2", "t1", 1), sort("t3"), part("v4", "t3", 1), call("v5", "neg_1", Ref("v4"))]
    kept = _dedupe(calls, {"a0": 1, "v2": 2, "v4": 3, "v5": 4})
    assert [c.out for c in kept] == ["t1", "v2", "v5"]
    assert kept[2].reads == ["v2"]


def test_a_tuple_call_that_writes_is_not_shared():
    calls = [call("t1", "sort_0", Ref("a0")), call("t2", "sort_0", Ref("a0"))]
    for line in calls:
        line.effect = True                                 # not marked "parts": it may write
    assert len(_dedupe(calls, {"a0": 1})) == 2


def test_a_repeated_check_is_dropped_unless_its_memory_changed_between():
    def check():
        line = Call(("assertasync_0", "(", Ref("v1"), ")"), ["v1"], True)
        line.kind = "check"
        return line

    write = Call(("v1", ".", "zero_()"), ["v1"], True, written=["v1"], written_storages=[2])
    assert len(_dedupe([check(), check()], {"v1": 2})) == 1
    assert len(_dedupe([check(), write, check()], {"v1": 2})) == 3


def test_a_window_covering_its_whole_tensor_is_the_tensor_itself():
    """`v1 = a0[0:1, :]` where a0 is [1, H] (a specialisation's shapes are static): later calls read a0, and the
    copy into such a window copies into a0 itself; a window of part of a tensor, or a returned one, stays."""
    from pypto_rt.replay.passes import _whole_windows

    def window(out, base, key, whole):
        line = Call((Ref(base), f"[{key}]"), [base], False, out=out)
        line.kind, line.whole = "window", whole
        return line

    calls = [window("v1", "a0", "0:1, :", True), call("v2", "exp_0", Ref("v1")),
             window("v3", "a1", "0:1, :", True), call(None, "copy_1", Ref("v3"), Ref("v2")),
             window("v4", "a1", "0:1, 0:4", False), window("v5", "a2", "0:1, :", True)]
    kept = _whole_windows(calls, {"v4", "v5"})
    assert [text(c.code) for c in kept] == ["exp_0(a0)", "copy_1(a1, v2)", "a1[0:1, 0:4]", "a2[0:1, :]"]
    assert kept[1].reads == ["a1", "v2"]
