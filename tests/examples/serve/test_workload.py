"""The flagship's request stream (examples/serve/workload.py): seeded, varied lengths, shared prefixes,
arrivals spread over steps, every rank gets requests."""
from examples.serve.workload import WorkloadShape, assign_rank, longest_request, make_workload

SHAPE = WorkloadShape(num_requests=24, prompt_len=(4, 12), output_len=(2, 9), prefix_len=8)


def test_a_seed_gives_the_same_stream_and_another_seed_another():
    assert make_workload(SHAPE, 100, seed=1) == make_workload(SHAPE, 100, seed=1)
    assert make_workload(SHAPE, 100, seed=1) != make_workload(SHAPE, 100, seed=2)


def test_requests_differ_share_prefixes_and_arrive_over_time():
    reqs = make_workload(SHAPE, 100, seed=0)
    assert [r.request_id for r in reqs] == list(range(24))
    assert len({len(r.prompt) for r in reqs}) > 3 and len({r.max_new_tokens for r in reqs}) > 3
    heads = [r.prompt[:SHAPE.prefix_len] for r in reqs]
    assert max(heads.count(h) for h in heads) >= 3                     # a prefix several requests share
    steps = [r.arrival_step for r in reqs]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] > 10
    assert all(0 < t < 100 for r in reqs for t in r.prompt)             # id 0 is the runner's padding
    assert longest_request(reqs) == max(len(r.prompt) + r.max_new_tokens for r in reqs)


def test_requests_are_spread_over_every_rank():
    reqs = make_workload(SHAPE, 100, seed=0)
    assert {assign_rank(r, 4) for r in reqs} == {0, 1, 2, 3}
