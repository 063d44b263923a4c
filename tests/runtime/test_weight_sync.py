"""Weight sync from a torch HF model into two real vLLM instances over a real gloo group (CPU tier).

Proves every sync: the instances' checksums equal the trainer's, the instances' sampled-token log-probs
equal an HF forward pass on the new weights, and their greedy output changes with the weights. Also the
failure modes: a round with nothing to send, a disabled communicator, a broken group, a rank claimed
twice, a collective that never completes; and the bounded-memory checksum's detection and determinism.
"""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")
pytest.importorskip("vllm")

from mindspeed_asp.errors import WeightSyncError, WeightSyncTimeout  # noqa: E402
from mindspeed_asp.runtime.instance import start_instances  # noqa: E402
from mindspeed_asp.runtime.platform import platform_from_name  # noqa: E402
from mindspeed_asp.runtime.tiny_model import load_hf_model  # noqa: E402
from mindspeed_asp.runtime.requests import EngineConfig, GroupRequest  # noqa: E402
from mindspeed_asp.runtime.weight_sync.buckets import make_manifest, pack_bucket, plan_buckets, unpack_bucket  # noqa: E402
from mindspeed_asp.runtime.weight_sync.checksums import (  # noqa: E402
    CHECKSUM_BLOCK,
    CHECKSUM_CHUNK_CPU,
    checksums_match,
    tensor_checksum,
)
from mindspeed_asp.runtime.weight_sync.communicators import GlooCommunicator, _PyCommunicator, make_communicator  # noqa: E402
from mindspeed_asp.runtime.weight_sync.group_store import free_port  # noqa: E402
from mindspeed_asp.runtime.weight_sync.instance_sync import init_weight_sync, sync_weights  # noqa: E402
from mindspeed_asp.runtime.weight_sync.sender import WeightSyncSender  # noqa: E402

CPU = platform_from_name("cpu")
PROMPT = [11, 23, 5, 42, 7, 99]


@pytest.fixture(scope="module")
def cluster(tiny_model, local_ray):
    cfg = EngineConfig(model_path=tiny_model, slots=8, max_model_len=256)
    actors, infos = start_instances([cfg, cfg], platform=CPU, timeout_s=240, retries=1)
    # small buckets so a round really spans several broadcasts
    sender = WeightSyncSender(CPU, "127.0.0.1", 0, world_size=3, bucket_bytes=256 << 10, timeout_s=60)
    offsets = init_weight_sync(sender, actors)
    state = {"actors": actors, "sender": sender, "offsets": offsets}
    yield state
    state["sender"].close()
    for a in actors:
        try:
            ray.get(a.shutdown.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - best-effort clean-up of a test actor
            pass
        ray.kill(a)


def _generate(actor, group: GroupRequest, timeout: float = 120.0):
    ray.get(actor.submit.remote([group]))
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = ray.get(actor.drain_finished.remote())
        if done:
            return done[0]
        time.sleep(0.05)
    raise AssertionError("generation timed out")


def _hf_token_logprobs(model, prompt, tokens):
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
    return [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(tokens)]


def _perturbed(model, seed: int):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5 * (p.std() + 0.02))
    return model


def test_bucket_plan_roundtrip():
    tensors = [torch.randn(3, 5), torch.arange(7, dtype=torch.int64), torch.randn(2, dtype=torch.float16),
               torch.randn(64, 64)]
    manifest = make_manifest([(f"t{i}", t) for i, t in enumerate(tensors)])
    buckets = plan_buckets(manifest, bucket_bytes=200)
    assert sorted(i for b in buckets for i, _, _ in b) == list(range(len(tensors)))
    assert len(buckets) >= 2  # the 16 KiB tensor cannot share a 200-byte bucket
    for b in buckets:
        flat = pack_bucket(tensors, b, torch.device("cpu"))
        for name, t in unpack_bucket(flat, manifest, b):
            assert torch.equal(t, tensors[int(name[1:])])


def test_checksum_detects_changes():
    t = torch.randn(100)
    assert tensor_checksum(t) == tensor_checksum(t.clone())
    assert tensor_checksum(t) != tensor_checksum(t.flip(0))
    assert tensor_checksum(t) != tensor_checksum(torch.zeros(100))
    assert checksums_match({"a": 1.0, "b": 2.0}, {"a": 1.0, "b": 2.0}) == []
    assert checksums_match({"a": 1.0, "b": 2.0}, {"a": 1.0, "b": 2.5}) == ["b"]
    assert checksums_match({"a": 1.0}, {"a": float("nan")}) == ["a"]
    assert checksums_match({"a": 1.0}, {}) == ["a"]


def _checksum_fixture(n: int):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, generator=g).to(torch.bfloat16)


def test_checksum_catches_permutation_unwritten_chunk_and_swaps():
    chunk = 2 * CHECKSUM_BLOCK
    x = _checksum_fixture(5 * chunk + 123)
    i, j = 7, 3 * chunk + 7  # the same position in two different chunks
    x[i], x[j] = 2.0, -2.0
    ref = tensor_checksum(x, chunk)
    assert tensor_checksum(x.clone(), chunk) == ref

    def swapped(a, b):
        y = x.clone()
        y[a], y[b] = x[b], x[a]
        return y

    unwritten = x.clone()
    unwritten[2 * chunk:3 * chunk] = 0  # one chunk of a transfer that never arrived
    g = torch.Generator().manual_seed(1)
    bad = {"permuted": x[torch.randperm(x.numel(), generator=g)], "unwritten chunk": unwritten,
           "swap across chunks": swapped(i, j), "swap across blocks": swapped(i, i + CHECKSUM_BLOCK),
           "transposed": x[:4 * chunk].view(64, -1).t().contiguous().view(-1),
           "neighbours swapped": swapped(i, i + 1)}
    for what, y in bad.items():
        assert checksums_match({"w": ref}, {"w": tensor_checksum(y, chunk)}) == ["w"], what


def test_checksum_catches_a_swap_in_a_large_tensor_at_the_default_chunk():
    x = _checksum_fixture(4 * CHECKSUM_CHUNK_CPU + 99)
    i, j = 1000, 2 * CHECKSUM_CHUNK_CPU + 1000
    x[i], x[j] = 1.5, -1.5
    y = x.clone()
    y[i], y[j] = x[j], x[i]
    assert checksums_match({"w": tensor_checksum(x)}, {"w": tensor_checksum(y)}) == ["w"]


def test_checksum_is_the_same_for_any_chunk_thread_count_and_layout():
    x = _checksum_fixture(3 * CHECKSUM_BLOCK * 7 + 501)
    threads = torch.get_num_threads()
    try:
        values = set()
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            for chunk in (CHECKSUM_BLOCK, 3 * CHECKSUM_BLOCK, None):
                values.add(tensor_checksum(x, chunk))
    finally:
        torch.set_num_threads(threads)
    assert len(values) == 1  # bit-identical: two processes checking the same bytes agree exactly
    m = torch.randn(3000, 70)
    assert tensor_checksum(m.t()) == tensor_checksum(m.t().contiguous())  # read without a full copy
    assert tensor_checksum(m[:, 3]) == tensor_checksum(m[:, 3].contiguous())
    assert tensor_checksum(torch.empty(0, 4)) == 0.0
    assert tensor_checksum(torch.arange(10)) == tensor_checksum(torch.arange(10.0))


def test_checksum_never_allocates_more_than_one_chunk():
    """Every tensor an op creates during the check is at most one fp32 chunk (a `.double()` would not be)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Allocations(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sizes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs))[0]
                      if isinstance(a, torch.Tensor)}
            self.sizes += [(str(func), o.untyped_storage().nbytes()) for o in tree_flatten(out)[0]
                           if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in inputs]
            return out

    chunk = 2 * CHECKSUM_BLOCK
    cases = {"bf16": _checksum_fixture(9 * chunk + 5), "fp32 strided": torch.randn(9 * chunk + 5, 4)[:, 1]}
    for what, x in cases.items():
        tensor_checksum(x, chunk)  # position weights are cached per device: not part of the check
        with Allocations() as seen:
            tensor_checksum(x, chunk)
        assert seen.sizes and max(n for _, n in seen.sizes) <= 4 * chunk, (what, max(seen.sizes, key=lambda s: s[1]))
        # one plain and one weighted block sum per full chunk (9); the 5-element tail is summed alone
        assert sum(1 for f, _ in seen.sizes if "sum.dim_IntList" in f) == 2 * 9
        assert 4 * x.numel() > 8 * chunk  # the tensor's fp32 copy would have been far larger
    with Allocations() as seen:
        cases["bf16"].double().sum()
    assert max(n for _, n in seen.sizes) > 4 * chunk  # the hook does see a full-size temporary


@pytest.mark.vllm
def test_sync_reaches_both_instances_and_matches_hf(cluster, tiny_model):
    actors, sender = cluster["actors"], cluster["sender"]
    assert cluster["offsets"] == [1, 2]
    greedy = GroupRequest("greedy-v0", "p", PROMPT, n=1, max_new_tokens=12, temperature=0.0, ignore_eos=True)
    before = [_generate(a, greedy).samples[0].token_ids for a in actors]
    assert before[0] == before[1]

    model = _perturbed(load_hf_model(tiny_model), seed=1)
    stats = sync_weights(sender, actors, 1, model.state_dict().items())
    assert stats.verified and stats.version == 1
    assert stats.tensors == len(model.state_dict()) and stats.bytes > 0 and stats.buckets > 1
    assert stats.seconds > 0 and len(stats.instance_seconds) == 2
    # embeddings, norms and lm_head are read back from vLLM's own parameters after the load
    assert all(n >= 2 * 2 + 3 for n in stats.engine_verified) and len(stats.engine_verified) == 2

    hf_sums = {n: tensor_checksum(t) for n, t in model.state_dict().items()}
    for a in actors:
        assert checksums_match(hf_sums, ray.get(a.weights_checksum.remote())) == []
        assert ray.get(a.status.remote())["version"] == 1

    # greedy output follows the new weights, identically on both instances and as HF's argmax
    greedy1 = GroupRequest("greedy-v1", "p", PROMPT, n=1, max_new_tokens=12, temperature=0.0, ignore_eos=True)
    after = [_generate(a, greedy1).samples[0].token_ids for a in actors]
    assert after[0] == after[1]
    assert after[0] != before[0]
    with torch.no_grad():
        ids = torch.tensor([PROMPT])
        hf_greedy = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None,
                                   pad_token_id=0)[0, len(PROMPT):].tolist()
    assert after[0] == hf_greedy

    # sampled tokens: the instance's behaviour log-probs equal HF's log-softmax on the new weights
    sampled = GroupRequest("sampled-v1", "p", PROMPT, n=2, max_new_tokens=10, temperature=1.0, seed=7,
                           ignore_eos=True)
    res = _generate(actors[1], sampled)
    for s in res.samples:
        assert s.min_version == s.max_version == 1
        ref = _hf_token_logprobs(model, PROMPT, s.token_ids)
        assert max(abs(x - y) for x, y in zip(s.logprobs, ref)) < 1e-3


@pytest.mark.vllm
def test_second_round_updates_again(cluster, tiny_model):
    actors, sender = cluster["actors"], cluster["sender"]
    model = _perturbed(load_hf_model(tiny_model), seed=2)
    stats = sync_weights(sender, actors, 2, model.named_parameters())
    assert stats.verified
    sums = ray.get([a.weights_checksum.remote() for a in actors])
    expect = {n: tensor_checksum(p) for n, p in model.named_parameters()}
    assert all(checksums_match(expect, s) == [] for s in sums)
    res = _generate(actors[0], GroupRequest("s-v2", "p", PROMPT, n=1, max_new_tokens=6, seed=3, ignore_eos=True))
    ref = _hf_token_logprobs(model, PROMPT, res.samples[0].token_ids)
    assert max(abs(x - y) for x, y in zip(res.samples[0].logprobs, ref)) < 1e-3
    assert len(sender.history) >= 2


@pytest.mark.vllm
def test_sync_lands_between_steps_of_inflight_requests(cluster, tiny_model):
    """An update during generation: the sample records both the old and the new version."""
    actors, sender = cluster["actors"], cluster["sender"]
    v_old = ray.get(actors[0].status.remote())["version"]
    before = ray.get(actors[0].status.remote())["generated_tokens"]
    ray.get(actors[0].submit.remote([GroupRequest("inflight", "p", PROMPT, n=2, max_new_tokens=400, seed=1,
                                                  ignore_eos=True)]))
    deadline = time.time() + 60
    while ray.get(actors[0].status.remote())["generated_tokens"] <= before:
        assert time.time() < deadline
        time.sleep(0.01)
    model = _perturbed(load_hf_model(tiny_model), seed=5)
    stats = sync_weights(sender, actors, v_old + 1, model.state_dict().items())
    assert stats.verified
    ray.get(actors[0].submit.remote([GroupRequest("after", "p", PROMPT, n=1, max_new_tokens=2, ignore_eos=True)]))
    got = {}
    deadline = time.time() + 120
    while not {"inflight", "after"} <= set(got):
        assert time.time() < deadline
        got.update({r.group_id: r for r in ray.get(actors[0].drain_finished.remote())})
        time.sleep(0.05)
    assert got["after"].samples[0].min_version == v_old + 1
    for smp in got["inflight"].samples:
        assert smp.min_version == v_old and smp.max_version == v_old + 1
        cut = smp.token_versions.index(v_old + 1)
        assert 0 < cut < len(smp.token_ids) and set(smp.token_versions[cut:]) == {v_old + 1}


@pytest.mark.vllm
def test_group_can_be_reformed(cluster, tiny_model):
    """A driver that lost an instance re-forms the group on a new port; the old group is closed."""
    actors = cluster["actors"]
    cluster["sender"].close()
    sender = WeightSyncSender(CPU, "127.0.0.1", 0, world_size=3, timeout_s=60)
    assert init_weight_sync(sender, actors) == [1, 2]
    cluster["sender"] = sender
    model = _perturbed(load_hf_model(tiny_model), seed=9)
    v = ray.get(actors[0].status.remote())["version"] + 1
    assert sync_weights(sender, actors, v, model.state_dict().items()).verified
    assert [ray.get(a.status.remote())["version"] for a in actors] == [v, v]


@pytest.mark.vllm
def test_round_with_nothing_raises(cluster):
    with pytest.raises(WeightSyncError, match="no tensors"):
        sync_weights(cluster["sender"], cluster["actors"], 3, [])
    with pytest.raises(WeightSyncError, match="no tensors"):
        cluster["sender"].start(3, [])


def test_uninitialised_sender_and_tiny_world_raise():
    s = WeightSyncSender(CPU, world_size=2)
    with pytest.raises(WeightSyncError, match="not initialised"):
        s.send(1, [("w", torch.zeros(2))])
    with pytest.raises(WeightSyncError, match="world_size 1"):
        make_communicator(CPU, "127.0.0.1", free_port(), 0, 1)


def test_disabled_communicator_is_refused():
    """PyNccl/PyHccl turn into silent no-ops when their library is missing: we must raise instead."""

    class DisabledComm:  # what PyNcclCommunicator looks like after it failed to load libnccl
        def __init__(self, group, device):
            self.available, self.disabled = False, True

    with pytest.raises(WeightSyncError, match="disabled"):
        _PyCommunicator(DisabledComm, "127.0.0.1", free_port(), 0, 1, None, 10, CPU)


def test_a_rank_claimed_twice_is_refused():
    port = free_port()
    errors = []

    def member(rank):
        try:
            make_communicator(CPU, "127.0.0.1", port, rank, 3, timeout_s=2, label=f"member {rank}")
        except WeightSyncError as exc:
            errors.append(exc)

    members = [threading.Thread(target=member, args=(r,)) for r in (0, 1)]
    for th in members:
        th.start()
    time.sleep(0.5)  # rank 1 is claimed before the second claimant arrives
    with pytest.raises(WeightSyncError, match="rank 1 .* already taken by 'member 1'"):
        GlooCommunicator("127.0.0.1", port, 1, 3, timeout_s=2, label="member 1 again")
    for th in members:
        th.join(30)
    assert len(errors) == 2 and all("2 of 3 did not join" in str(e) for e in errors)  # rank 2 never came


def test_a_device_collective_that_never_completes_times_out():
    """PyNccl/PyHccl broadcasts are awaited by polling an event: a peer that never joins is a timeout."""

    class NeverDone:  # the event of a collective whose peer never arrived
        def record(self, stream):
            pass

        def query(self):
            return False

    class Comm:
        available, disabled = True, False

        def __init__(self, group, device):
            self.calls = 0

        def broadcast(self, tensor, src, stream):
            self.calls += 1

    class FakeNccl(_PyCommunicator):
        backend = "nccl"

    fake = SimpleNamespace(current_stream=lambda: None, torch_module=SimpleNamespace(Event=NeverDone))
    comm = FakeNccl(Comm, "127.0.0.1", free_port(), 0, 1, None, 0.5, fake, label="trainer")
    t0 = time.monotonic()
    with pytest.raises(WeightSyncTimeout,
                       match=r"trainer: a nccl broadcast from rank 0 \(trainer\) did not complete within 0.5 s"):
        comm.broadcast(torch.zeros(4), src=0)
    assert 0.4 < time.monotonic() - t0 < 5
    with pytest.raises(WeightSyncError, match="unusable"):
        comm.broadcast(torch.zeros(4), src=0)
    assert comm.comm.calls == 1


def test_broken_group_raises():
    """A peer that leaves the group makes the trainer's broadcast fail loudly, not hang or pass."""
    port = free_port()
    peer_ready = threading.Event()
    errors = []

    def peer():
        try:
            comm = make_communicator(CPU, "127.0.0.1", port, 1, 2, timeout_s=5)
            peer_ready.set()
            comm.close()
        except Exception as exc:  # noqa: BLE001  pragma: no cover - reported by the assertion below
            errors.append(exc)
            peer_ready.set()

    th = threading.Thread(target=peer)
    th.start()
    sender = WeightSyncSender(CPU, "127.0.0.1", port, world_size=2, timeout_s=5)
    sender.init()
    peer_ready.wait(30)
    th.join(30)
    assert not errors
    with pytest.raises(WeightSyncError):
        sender.send(1, [("w", torch.randn(1000))])
    sender.close()
