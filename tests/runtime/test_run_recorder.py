"""RunRecorder's summary: the learning keys (final reward, time to target) and the length-starvation keys."""
import json

import pytest

from mindspeed_asp.runtime.run_recorder import GroupSpan, RunRecorder


def _recorder(tmp_path, target=0.3):
    clock = iter(range(1000)).__next__
    return RunRecorder(tmp_path, mode="asp", instances=1, slots=8, minibatch_groups=1, max_lag=1,
                       clock=lambda: float(clock()), target_reward=target)


def test_summary_reports_time_to_target_and_discarded_lengths(tmp_path):
    rec = _recorder(tmp_path)
    span = lambda gid, submit, lengths, trained: GroupSpan(  # noqa: E731
        instance=0, gid=gid, submit=submit, start=submit, end=submit + 1, prompt_tokens=4,
        response_tokens=sum(lengths), sample_lengths=lengths, version=0, window=0, trained=trained)
    rec.group(span(0, 2.0, [4, 4], True))
    rec.group(span(1, 2.0, [50, 50], False))  # stale, regenerated below
    rec.group(span(2, 3.0, [6, 6], True))
    rec.group(span(1, 6.0, [40, 40], True))
    rec.group(span(3, 7.0, [9, 9], True))
    for k, (reward, t_end) in enumerate([(0.1, 4.0), (0.2, 6.0), (0.5, 8.0), (0.6, 10.0)]):
        rec.log_step({"step": k, "version": k + 1, "t_end": t_end, "reward/mean": reward, "tokens/trained": 8,
                      "time/iteration": 2.0}, [1, 1])
    s = rec.summary()
    assert s["reward/final"] == 0.6
    # trailing means 0.1, 0.15, 0.267, 0.433: the fourth update reaches 0.3, 10 - 2 = 8 s after the first dispatch
    assert s["learning/updates_to_target"] == 4 and s["learning/seconds_to_target"] == 8.0
    assert s["length/discarded_share"] == pytest.approx(0.2)
    # quartile edges of the means (4, 50, 6, 40, 9) put 40 and 50 in the top quarter: one of the two discarded
    assert s["length/discarded_share_q4"] == 0.5 and s["length/discarded_share_q1"] == 0.0
    assert s["length/generated_mean"] == pytest.approx(21.8) and s["length/trained_mean"] == pytest.approx(14.75)
    rec.close()
    json.dumps(s)  # the summary stays JSON


def test_no_target_no_learning_keys(tmp_path):
    rec = _recorder(tmp_path, target=None)
    rec.log_step({"step": 0, "version": 1, "t_end": 1.0, "reward/mean": 0.5}, [0])
    s = rec.summary()
    assert s["learning/target_reward"] is None and "learning/seconds_to_target" not in s
    rec.close()
