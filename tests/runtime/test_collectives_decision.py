"""The decision (policy) alone: decide() from made-up agreed states, no processes."""

import itertools
import random

import pytest

from tvmsched.errors import TvmschedError
from tvmsched.runtime.collectives.decision import JobState, OpTiming, Profile, SwitchState, decide


def _job(name, step_s, ops, ref_time=0.0, ref_seq=0, lease=10_000, steps_left=None):
    return JobState(job=name, profile=Profile(step_s=step_s, ops=tuple(ops), hosts=2, steps_left=steps_left),
                    ref_seq=ref_seq, ref_time=ref_time, eff_seq=0, lease_seq=lease)


def _op(offset, ring, innet=None, exposed=1.0):
    return OpTiming(offset_s=offset, nbytes=1 << 20, ring_s=ring, innet_s=ring / 2 if innet is None else innet, exposed=exposed)


def test_alone_on_the_switch_takes_it_within_its_lease_only():
    st = SwitchState(version=1, policy="tdm", jobs=(_job("a", 1.0, [_op(0.5, 0.1)], lease=9),))
    assert decide(st, "a", 0) .innet and decide(st, "a", 9).innet
    assert not decide(st, "a", 10).innet  # past the lease: ring until a new state is agreed
    assert decide(st, "b", 0).reason == "job not in the agreed state"


def test_no_overlap_means_both_take_it():
    # a's AllReduce at [0.1, 0.15) of every 1 s step, b's at [0.6, 0.65): never together
    st = SwitchState(version=1, policy="tdm", jobs=(_job("a", 1.0, [_op(0.1, 0.1)]), _job("b", 1.0, [_op(0.6, 0.1)])))
    for seq in range(20):
        assert decide(st, "a", seq).innet and decide(st, "b", seq).innet


def test_overlapping_allreduces_never_both_take_the_switch():
    rng = random.Random(7)
    for trial in range(40):
        jobs = []
        for name in "abc":
            n = rng.randint(1, 4)
            offsets = sorted(rng.uniform(0, 0.5) for _ in range(n))
            jobs.append(_job(name, rng.uniform(0.3, 0.8), [_op(o, rng.uniform(0.01, 0.2), exposed=rng.choice([0.0, 1.0])) for o in offsets],
                             ref_time=rng.uniform(0, 0.3), steps_left=rng.choice([None, 5, 50])))
        st = SwitchState(version=1, policy=rng.choice(["tdm", "mina"]), jobs=tuple(jobs))
        windows = []
        for js in jobs:
            n = len(js.profile.ops)
            for seq in range(4 * n):
                step, i = divmod(seq, n)
                o = js.profile.ops[i]
                start = js.ref_time + step * js.profile.step_s + o.offset_s
                windows.append((js.job, seq, start, start + o.innet_s, decide(st, js.job, seq).innet))
        for (j1, s1, a1, b1, in1), (j2, s2, a2, b2, in2) in itertools.combinations(windows, 2):
            if j1 != j2 and a1 < b2 and a2 < b1:
                assert not (in1 and in2), f"trial {trial}: {j1}#{s1} and {j2}#{s2} overlap and both took the switch"
        assert any(w[4] for w in windows)  # the switch is used at all


def test_the_same_state_gives_the_same_decisions_after_a_json_round_trip():
    st = SwitchState(version=3, policy="tdm", jobs=(_job("a", 0.5, [_op(0.0, 0.2), _op(0.1, 0.2)]), _job("b", 0.4, [_op(0.05, 0.3)])))
    again = SwitchState.from_json(st.to_json())
    assert again == st
    assert [decide(st, j, s) for j in "ab" for s in range(30)] == [decide(again, j, s) for j in "ab" for s in range(30)]


def test_exclusive_spatial_and_none():
    jobs = (_job("a", 1.0, [_op(0.1, 0.1)]), _job("b", 1.0, [_op(0.1, 0.1)]))
    assert [decide(SwitchState(policy="exclusive", jobs=jobs, owner="b"), j, 0).innet for j in "ab"] == [False, True]
    assert [decide(SwitchState(policy="spatial", jobs=jobs), j, 0).innet for j in "ab"] == [True, True]
    assert [decide(SwitchState(policy="none", jobs=jobs), j, 0).innet for j in "ab"] == [False, False]
    with pytest.raises(TvmschedError, match="valid: tdm, mina"):
        SwitchState(policy="greedy")


def test_without_a_profile_a_job_runs_ring_and_does_not_block_others():
    st = SwitchState(policy="tdm", jobs=(JobState("a", None, lease_seq=100), _job("b", 1.0, [_op(0.0, 1.0)])))
    assert not decide(st, "a", 0).innet
    assert decide(st, "b", 0).innet


def test_measured_profile_marks_hidden_allreduces():
    # three buckets ready at 0, 0.5, 0.6 s, each 0.1 s ring: the first finishes at 0.1, long before the
    # second is ready, so saving on it changes nothing; the last two run back to back to the end
    p = Profile.measured(1.0, [0.0, 0.5, 0.6], [1, 2, 3], [0.1, 0.1, 0.1], [0.05] * 3, hosts=4)
    assert [o.exposed for o in p.ops] == [0.0, 1.0, 1.0]
    assert p.hosts == 4 and [o.nbytes for o in p.ops] == [1, 2, 3]
