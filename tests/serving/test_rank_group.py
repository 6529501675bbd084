"""RankGroup outside a launched job is this process alone: every call is local and says what one rank would."""
from pypto_rt.serving import RankGroup


def test_a_plain_process_is_a_group_of_one():
    group = RankGroup.of_this_job()
    assert (group.rank, group.world_size) == (0, 1)
    assert group.allreduce_sum([3, 4]) == [3, 4]
    assert group.done_everywhere(True) and not group.done_everywhere(False)
    assert group.gather({"rank": 0}) == [{"rank": 0}]
    group.barrier()
