"""The task interface (runtime/tasks/): the demo task unchanged by the move, the replay task's imposed lengths
(drawn per epoch from per-prompt distributions that persist, scaled with the cap share kept), their config
refusals, the long-tail config's shape, and one real vLLM engine generating exactly the drawn lengths."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import types
import typing
from pathlib import Path

import numpy as np
import pytest

from mindspeed_asp.errors import ConfigError
from mindspeed_asp.runtime.run_config import ReplaySection, load_run_config, packaged_config_path
from mindspeed_asp.runtime.tasks import GenerationLimits, Task, build_task
from mindspeed_asp.runtime.tasks.demo import DemoTask
from mindspeed_asp.runtime.tasks.replay import KINDS, REPLAY_EPOCHS, ReplayTask, scale_lengths
from mindspeed_asp.runtime.tiny_model import EOS_TOKEN_ID
from mindspeed_asp.runtime.requests import GroupRequest
from mindspeed_asp.workloads.prompts import load_prompt_set
from mindspeed_asp.workloads.synthetic import MODES, SyntheticRLWorkload

ROOT = Path(__file__).resolve().parents[2]
LONGTAIL = ROOT / "configs" / "tiny_cpu_longtail.yaml"
#: the commit whose runtime/demo_task.py the moved DemoTask must reproduce bit for bit
DEMO_COMMIT = "376e9f55e372617ef8dfd0472c07680711a06230"
#: digests of (prompts, targets, describe()) of that DemoTask, for when git or the commit is not at hand
DEMO_DIGESTS = {(48, 0, 160): "c1b6c780a85b3040", (64, 3, 128): "59aa1f55b9d84a3e", (200, 1, 128): "9cfb565ac761ea11"}


def _digest(task) -> str:
    rows = [task.prompts(), [task.target_len(p[0]) for p in task.prompts()], task.describe()]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def _cfg(*overrides: str, path: Path = ROOT / "configs" / "tiny_cpu.yaml"):
    return load_run_config(path, list(overrides))


def _replay_cfg(*overrides: str):
    return _cfg("data.task=replay", *overrides)


# ------------------------------------------------------------------------------------------ the interface
def test_both_tasks_implement_the_interface():
    demo = build_task(_cfg(), None)
    replay = build_task(_replay_cfg("data.replay.kind=chat"), None)
    assert isinstance(demo, DemoTask) and isinstance(replay, ReplayTask)
    for task in (demo, replay):
        assert isinstance(task, Task) and task.eos_token_id == EOS_TOKEN_ID
        prompts = task.prompts()
        assert len(prompts) == 48 and len({p[0] for p in prompts}) == 48
        ps = task.prompt_set(4)
        assert list(ps.prompt_ids) == [p[0] for p in prompts] and list(ps.prompt_lens) == [len(p[1]) for p in prompts]
        assert ps.n == 4 and ps.fingerprint() == task.prompt_set(4).fingerprint() != task.prompt_set(5).fingerprint()
        assert all(0 <= t < 512 and t != EOS_TOKEN_ID for _, ids, _ in prompts for t in ids)
        for i in (0, 47):
            lim = task.limits(i, 3)
            assert isinstance(lim, GenerationLimits) and 1 <= lim.max_new_tokens <= prompts[i][2]
        for bad in ((48, 0), (-1, 0), (0, -1)):
            with pytest.raises(IndexError):
                task.limits(*bad)
    assert demo.prompt_set(4).fingerprint() != replay.prompt_set(4).fingerprint()


def test_generation_limits_and_group_request_bounds():
    with pytest.raises(ValueError, match="min_tokens"):
        GenerationLimits(max_new_tokens=4, min_tokens=5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationLimits(max_new_tokens=0)
    with pytest.raises(ValueError, match="sample length 9"):
        GenerationLimits(max_new_tokens=8, sample_lengths=(3, 9))
    lim = GenerationLimits.exact([7, 3, 12])
    assert (lim.max_new_tokens, lim.min_tokens, lim.ignore_eos, lim.sample_lengths) == (12, 3, True, (7, 3, 12))
    req = GroupRequest("g", "p", [5, 6], n=3, stop_token_ids=[EOS_TOKEN_ID], **lim.request_fields())
    assert [req.sample_limits(i) for i in range(3)] == [(7, 7), (3, 3), (12, 12)]
    plain = GroupRequest("g", "p", [5, 6], n=2, max_new_tokens=10, min_tokens=4)
    assert plain.sample_limits(1) == (4, 10) and GroupRequest("g", "p", [5], 1, 10).sample_limits(0) == (0, 10)
    for kw, words in (({"max_new_tokens": 4, "min_tokens": 5}, "min_tokens"),
                      ({"max_new_tokens": 4, "min_tokens": -1}, "min_tokens"),
                      ({"max_new_tokens": 8, "sample_lengths": [3]}, "1 sample_lengths for n=2"),
                      ({"max_new_tokens": 8, "sample_lengths": [3, 9]}, "sample length 9"),
                      ({"max_new_tokens": 8, "min_tokens": 4, "sample_lengths": [3, 8]}, "sample length 3")):
        with pytest.raises(ValueError, match=words):
            GroupRequest("g", "p", [5], n=2, **kw)


# ------------------------------------------------------------------------------------------ demo
def _head_demo_module():
    """runtime/demo_task.py as of DEMO_COMMIT, loaded as a module of its own (None without git or that commit)."""
    try:
        src = subprocess.run(["git", "show", f"{DEMO_COMMIT}:mindspeed_asp/runtime/demo_task.py"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if src.returncode != 0:
        return None
    # the helper it imports moved since (the task's own code did not): point the import at where it lives now
    code = src.stdout.replace("from mindspeed_asp.atomic import", "from mindspeed_asp.utils.atomic import")
    name = "asp_old_demo_task"
    mod = types.ModuleType(name)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    exec(compile(code, f"{DEMO_COMMIT[:8]}:mindspeed_asp/runtime/demo_task.py", "exec"), mod.__dict__)
    return mod


def test_demo_task_is_bit_identical_after_the_move(tmp_path):
    for (num, seed, cap), digest in DEMO_DIGESTS.items():
        assert _digest(DemoTask(num, seed=seed, max_new_tokens=cap)) == digest
    old = _head_demo_module()
    if old is None:
        pytest.skip(f"git or commit {DEMO_COMMIT[:8]} not available: checked against the recorded digests only")
    rng = np.random.default_rng(0)
    for num, seed, cap in DEMO_DIGESTS:
        a, b = old.DemoTask(num, seed=seed, max_new_tokens=cap), DemoTask(num, seed=seed, max_new_tokens=cap)
        assert a.prompts() == b.prompts() and a.describe() == b.describe()
        for pid, _, _ in a.prompts()[:20]:
            resp = rng.integers(0, 512, size=int(rng.integers(0, 40))).tolist()
            assert a.reward(pid, resp) == b.reward(pid, resp)
            assert a.reward(pid, a.optimal_response(pid)) == b.reward(pid, b.optimal_response(pid)) == 1.0
        a.to_jsonl(tmp_path / "a.jsonl")
        b.to_jsonl(tmp_path / "b.jsonl")
        assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    # the PromptSet is the one driver.task_and_prompts built (same ids, lengths, n and origin)
    cfg = _cfg()
    task = build_task(cfg, None)
    ps = task.prompt_set(cfg.data.n)
    assert ps.origin == f"demo task (num_prompts={cfg.data.num_prompts}, seed={cfg.data.seed})"
    old_task = old.DemoTask(cfg.data.num_prompts, seed=cfg.data.seed, max_new_tokens=cfg.data.max_new_tokens)
    assert list(ps.prompt_ids) == [p[0] for p in old_task.prompts()]


def test_demo_limits_are_the_prompt_cap_stopping_at_eos():
    task = DemoTask(30, seed=2, max_new_tokens=64)
    for i, (_, _, cap) in enumerate(task.prompts()):
        for epoch in (0, 5):
            assert task.limits(i, epoch) == GenerationLimits(max_new_tokens=cap, min_tokens=0, ignore_eos=False)
    assert task.limits(0, 0).request_fields() == {"max_new_tokens": task.prompts()[0][2], "min_tokens": 0,
                                                  "ignore_eos": False, "sample_lengths": None}


# ------------------------------------------------------------------------------------------ replay
def test_replay_kinds_match_the_generator_and_the_config():
    kind = ReplaySection.model_fields["kind"].annotation
    literal = next(a for a in typing.get_args(kind) if a is not type(None))
    assert set(KINDS) == set(MODES) == set(typing.get_args(literal))


def test_replay_limits_impose_exact_lengths_drawn_per_epoch():
    task = ReplayTask(40, 4, 384, kind="long_cot", scale=1 / 80, seed=0, prompt_seed=1)
    again = ReplayTask(40, 4, 384, kind="long_cot", scale=1 / 80, seed=0, prompt_seed=1)
    again.epoch_lengths(3)  # asked in another order: the same draws
    for i in range(40):
        for epoch in range(4):
            lim = task.limits(i, epoch)
            lengths = task.lengths(i, epoch)
            assert lim == GenerationLimits.exact(lengths) == again.limits(i, epoch)
            assert lim.ignore_eos and lim.min_tokens == min(lengths) and lim.max_new_tokens == max(lengths)
            assert len(lengths) == 4 and all(1 <= x <= 384 for x in lengths)
    # a fresh draw every epoch
    assert not np.array_equal(task.epoch_lengths(0), task.epoch_lengths(1))
    assert np.mean(np.any(task.epoch_lengths(0) != task.epoch_lengths(1), axis=1)) > 0.9
    # other seeds, other lengths; the prompts do not depend on the length seed
    other = ReplayTask(40, 4, 384, kind="long_cot", scale=1 / 80, seed=1, prompt_seed=1)
    assert not np.array_equal(other.epoch_lengths(0), task.epoch_lengths(0)) and other.prompts() == task.prompts()
    # past the generator's horizon the epochs come round again
    assert np.array_equal(task.epoch_lengths(REPLAY_EPOCHS + 1), task.epoch_lengths(1))


@pytest.mark.parametrize("kind", ["long_cot", "chat", "tiny_decode", "summarisation"])
def test_replay_lengths_persist_per_prompt_across_epochs(kind):
    """A prompt long last epoch tends to be long again: group medians correlate across epochs (the generator's
    per-prompt latent), unlike the medians of two unrelated prompts."""
    task = ReplayTask(400, 8, 384, kind=kind)
    med = [np.log(np.median(task.epoch_lengths(e), axis=1)) for e in range(3)]
    for e in range(2):
        assert np.corrcoef(med[e], med[e + 1])[0, 1] > 0.5
    shuffled = np.random.default_rng(0).permutation(med[1])
    assert abs(np.corrcoef(med[0], shuffled)[0, 1]) < 0.2


def test_replay_scaling_keeps_the_cap_share():
    """Raw lengths x scale, capped; a raw length at the generator's cap (a loop) lands at the run's cap, so the
    share at the cap is the generator's."""
    cap, scale = 384, 1 / 80
    task = ReplayTask(300, 8, cap, kind="long_cot", scale=scale, seed=4)
    wl = SyntheticRLWorkload(300, n=8, epochs=REPLAY_EPOCHS, seed=4, mode="long_cot")
    for e in range(3):
        raw = wl.lengths(e)
        got = task.epoch_lengths(e)
        assert np.array_equal(got, scale_lengths(raw, 16384, scale, cap))
        body = raw < 16384
        assert np.array_equal(got[body], np.clip(np.rint(raw[body] * scale), 1, cap))
        assert np.array_equal(got >= cap, raw >= 16384) and 0.0 < np.mean(got >= cap) < 0.2
    # the default scale maps the generator's cap onto the run's
    fit = ReplayTask(50, 4, 256, kind="long_cot")
    assert fit.scale == 256 / 16384
    assert np.array_equal(scale_lengths(np.array([1, 3, 200, 16384]), 16384, 0.001, 10), [1, 1, 1, 10])


def test_replay_reward_is_the_demo_token_score(tmp_path):
    task = ReplayTask(8, 2, 64, kind="chat")
    pid = task.prompts()[0][0]
    answer = list(task.answer_tokens)
    filler = [task.answer_hi + 5] * 4
    assert task.reward(pid, answer[:4]) == 1.0 and task.reward(pid, filler) == 0.0
    assert task.reward(pid, answer[:2] + filler[:2]) == 0.5 and task.reward(pid, []) == 0.0
    with pytest.raises(KeyError, match="unknown replay prompt id"):
        task.reward("demo-00000", answer)
    path = task.to_jsonl(tmp_path / "dataset.jsonl")
    rows = [json.loads(x) for x in Path(path).read_text().splitlines()]
    assert [r["prompt_id"] for r in rows] == [p[0] for p in task.prompts()]
    assert all(r["source"] == "replay" and r["max_new_tokens"] == 64 for r in rows)
    ps = load_prompt_set(path, n=2)
    assert ps.fingerprint() == task.prompt_set(2).fingerprint()


def _history(path: Path, rows, cap=None) -> Path:
    with path.open("w") as fh:
        for pid, epoch, lengths in rows:
            rec = {"prompt_id": pid, "epoch": epoch, "lengths": lengths}
            if cap is not None:
                rec["max_new_tokens"] = cap
            fh.write(json.dumps(rec) + "\n")
    return path


def test_replay_from_a_history_trace(tmp_path):
    rows = [("a", 0, [10, 20, 30, 1000]), ("a", 1, [40, 50, 60, 70]), ("b", 0, [100, 200, 300, 400]),
            ("b", 1, [110, 210, 310, 410]), ("c", 0, [5, 6])]
    trace = _history(tmp_path / "h.jsonl", rows, cap=1000)
    cfg = _replay_cfg(f"data.replay.trace={trace}", "data.num_prompts=8", "data.max_new_tokens=100",
                      "asp.minibatch_groups=4")
    task = build_task(cfg, None)
    assert task.source_cap == 1000 and task.scale == 0.1
    pools = {pid: {} for pid in "abc"}
    for pid, epoch, lengths in rows:
        pools[pid][epoch] = lengths
    names = sorted(pools)
    for i in range(8):
        pid = names[int(task.source.order[i % 3])]
        for epoch in range(4):
            got = sorted(task.lengths(i, epoch))
            pool = pools[pid].get(epoch % 2) or sum(pools[pid].values(), [])
            want = scale_lengths(np.array(pool), 1000, 0.1, 100)
            if len(pool) >= 4:  # a group of n samples is replayed as it was (in another order)
                assert got == sorted(want.tolist())
            else:  # fewer than n: drawn with replacement from them
                assert set(got) <= set(want.tolist())
    # the sample at the trace's cap (1000) is at the run's cap
    a_index = next(i for i in range(8) if names[int(task.source.order[i % 3])] == "a")
    assert 100 in task.lengths(a_index, 0) and 100 in task.lengths(a_index, 2)


def test_replay_from_splitwise_and_alpaca_traces(tmp_path):
    csv = tmp_path / "sw.csv"
    csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" +
                   "".join(f"{k}.0,10,{(k + 1) * 10}\n" for k in range(8)))
    task = build_task(_replay_cfg(f"data.replay.trace={csv}", "data.max_new_tokens=45", "data.replay.scale=0.5"),
                      None)
    assert task.source_cap == 80 and task.scale == 0.5
    groups = {tuple(sorted(task.lengths(i, 0))) for i in range(48)}
    assert groups == {(5, 10, 15, 20), (25, 30, 35, 45)}  # 80 (the trace's longest: its cap) lands at the cap
    alpaca = tmp_path / "a.json"
    alpaca.write_text(json.dumps([{"id": i, "L_t0.0": 10 + i, "L_t0.3": 20, "L_t0.5": 30, "L_t0.7": 40}
                                  for i in range(3)]))
    task = build_task(_replay_cfg(f"data.replay.trace={alpaca}", "data.max_new_tokens=80"), None)
    assert task.source_cap == 40 and sorted(task.lengths(0, 0))[1:] == [40, 60, 80]


def test_replay_config_refusals(tmp_path):
    zero = _history(tmp_path / "zero.jsonl", [("a", 0, [3, 4]), ("b", 0, [0, 2])])
    huge = _history(tmp_path / "huge.jsonl", [("a", 0, [3, 10**7 + 1])])
    capped = _history(tmp_path / "capped.jsonl", [("a", 0, [3, 900])], cap=500)
    fine = _history(tmp_path / "fine.jsonl", [("a", 0, [3, 900])], cap=1000)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    at_load = [
        ((), "data.replay", "exactly one of data.replay.kind"),
        (("data.replay.kind=chat", f"data.replay.trace={fine}"), "data.replay", "exactly one"),
        (("data.replay.kind=poetry",), "data.replay.kind", "Input should be"),
        (("data.replay.kind=chat", "data.replay.scale=0"), "data.replay.scale", "greater than 0"),
        (("data.replay.kind=chat", "data.replay.scale=-1"), "data.replay.scale", "greater than 0"),
        (("data.replay.kind=chat", "data.replay.scale=1"), "data.replay", "data.replay.scale <= 0.078125"),
        ((f"data.replay.trace={tmp_path / 'missing.jsonl'}",), "data.replay.trace", "not found"),
        ((f"data.replay.trace={tmp_path / 'lengths.txt'}",), "data.replay.trace", "must end in"),
        (("data.replay.kind=chat", "data.replay.bogus=1"), "data.replay.bogus", "unknown key"),
    ]
    for overrides, key, words in at_load:
        with pytest.raises(ConfigError, match=words) as err:
            _replay_cfg(*overrides)
        assert err.value.key == key, overrides
    # the task ignores a replay section it does not use, so `data.task=demo` works on a replay config
    assert _cfg("data.replay.kind=chat").data.task == "demo"
    at_build = [
        (zero, "lengths", 2, "out of range"),
        (huge, "lengths", 1, "out of range"),
        (capped, "max_new_tokens", None, "exceeds the declared max_new_tokens 500"),
        (empty, None, None, "no lengths"),
    ]
    for trace, key, line, words in at_build:
        cfg = _replay_cfg(f"data.replay.trace={trace}")
        with pytest.raises(ConfigError, match=words) as err:
            build_task(cfg, None)
        assert err.value.key == key and err.value.line == line and str(trace) in str(err.value), trace
    with pytest.raises(ConfigError, match="scale 0.5 maps the source's cap of 1000") as err:
        build_task(_replay_cfg(f"data.replay.trace={fine}", "data.replay.scale=0.5"), None)
    assert err.value.key == "data.replay.scale"


def test_longtail_config_has_the_long_tail_shape():
    """configs/tiny_cpu_longtail.yaml: p99/median >= 8 and samples at the cap in every epoch the run trains on,
    and a token budget that keeps one `asp train` run within minutes on 2 cores."""
    assert packaged_config_path("tiny_cpu_longtail.yaml").read_text() == LONGTAIL.read_text()
    cfg = load_run_config(LONGTAIL)
    assert cfg.data.task == "replay" and cfg.data.replay.kind == "long_cot"
    task = build_task(cfg, None)
    epochs = -(-cfg.run.steps * cfg.asp.minibatch_groups // cfg.data.num_prompts)
    shape = task.describe(epochs)
    assert shape["p99_over_median"] >= 8 and shape["cap_share"] > 0 and shape["max"] == cfg.data.max_new_tokens
    assert min(shape["epoch_p99_over_median"]) >= 8 and min(shape["epoch_cap_share"]) > 0
    assert sum(shape["tokens_per_epoch"]) < 80_000


# ------------------------------------------------------------------------------------------ real vLLM
@pytest.mark.vllm
def test_vllm_generates_exactly_the_drawn_lengths(tiny_model, local_ray):
    """A replay group (min_tokens = max_tokens per sample, ignore_eos, EOS as a stop token as the driver sends
    it) comes back from a real vLLM engine with every sample exactly its drawn length."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("vllm")
    from mindspeed_asp.runtime.instance import start_instances
    from mindspeed_asp.runtime.platform import platform_from_name
    from mindspeed_asp.runtime.requests import EngineConfig

    cfg = load_run_config(LONGTAIL)
    task = build_task(cfg, tiny_model)
    lengths = task.epoch_lengths(0)
    # the groups with the widest spread, one with a sample at the cap among them
    spread = lengths.max(axis=1) - lengths.min(axis=1)
    rows = list(np.argsort(-spread)[:3])
    at_cap = [i for i in range(len(lengths)) if lengths[i].max() == cfg.data.max_new_tokens]
    rows = rows if set(rows) & set(at_cap) else rows[:2] + at_cap[:1]
    prompts = task.prompts()
    groups = [GroupRequest(group_id=f"r{i}", prompt_id=prompts[i][0], prompt_token_ids=list(prompts[i][1]),
                           n=cfg.data.n, seed=100 + int(i), stop_token_ids=[task.eos_token_id],
                           **task.limits(int(i), 0).request_fields()) for i in rows]
    actors, _ = start_instances([EngineConfig(model_path=tiny_model, slots=16, max_model_len=cfg.model.max_model_len)],
                                platform=platform_from_name("cpu"), timeout_s=240, retries=1)
    try:
        ray.get(actors[0].submit.remote(groups))
        got = {}
        deadline = time.time() + 240
        while len(got) < len(groups):
            assert time.time() < deadline, f"timed out; finished {sorted(got)}"
            for res in ray.get(actors[0].drain_finished.remote()):
                got[res.group_id] = res
            time.sleep(0.05)
    finally:
        try:
            ray.get(actors[0].shutdown.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - best-effort clean-up of a test actor
            pass
        ray.kill(actors[0])
    for g in groups:
        res = got[g.group_id]
        assert [len(s.token_ids) for s in res.samples] == g.sample_lengths
        assert len(set(g.sample_lengths)) > 1  # the samples of one group differ in length
        for s in res.samples:
            assert s.finish_reason == "length" and task.eos_token_id not in s.token_ids
            assert len(s.logprobs) == len(s.token_ids) and all(np.isfinite(s.logprobs))
            assert 0.0 <= task.reward(g.prompt_id, s.token_ids) <= 1.0
    assert max(max(g.sample_lengths) for g in groups) == cfg.data.max_new_tokens
