"""The MindSpeed-RL weight transfer (WeightSender / WeightReceiver / sync_deadline) over real gloo groups.

Three processes (one sender, two receivers) run five versions through one sender and two receivers
built once; version 4 arrives corrupted at one receiver. In-process threads cover the deadlines: a
receiver that never joins, one that joins but never receives, a sender that never sends. On Ascend the
same code runs over vllm-ascend's PyHcclCommunicator.
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from mindspeed_asp.errors import WeightSyncError, WeightSyncTimeout  # noqa: E402
from mindspeed_asp.integrations.mindspeed_rl.weight_transfer import (  # noqa: E402
    WeightReceiver,
    WeightSender,
    backend_platform,
    sync_deadline,
)
from mindspeed_asp.runtime.weight_sync.group_store import free_port  # noqa: E402

VERSIONS = (1, 2, 3, 4, 5)
CORRUPT_VERSION, CORRUPT_RANK = 4, 2


def _params(version: int):
    g = torch.Generator().manual_seed(version)
    return {"embedding.word_embeddings.weight": torch.randn(40, 16, generator=g).to(torch.bfloat16),
            "decoder.layers.0.self_attention.linear_qkv.weight": torch.randn(48, 16, generator=g),
            "decoder.layers.0.self_attention.linear_qkv.bias": torch.randn(48, generator=g),
            "decoder.final_layernorm.weight": torch.ones(16) * version}


def _label(rank: int) -> str:
    return f"instance {rank - 1} tp-rank 0"


def _count_communicators():
    """Count group formations in this process (the objects must build theirs once, not per round)."""
    from mindspeed_asp.runtime.weight_sync import communicators, receiver, sender

    real, count = communicators.make_communicator, [0]

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    for mod in (sender, receiver):  # the modules whose objects form the groups look the name up there
        mod.make_communicator = counting
    return count


def _member(rank: int, port: int, q) -> None:
    try:
        count = _count_communicators()
        if rank == 0:
            sender = WeightSender("gloo", "127.0.0.1", port, world_size=3, timeout_s=20, bucket_bytes=2048)
            for v in VERSIONS:
                try:
                    q.put(("sent", v, sender.send(v, _params(v).items())))
                except WeightSyncError as exc:
                    q.put(("send-error", v, type(exc).__name__, str(exc)))
            sender.close()
        else:
            rx = WeightReceiver("gloo", "127.0.0.1", port, rank, world_size=3, timeout_s=20, label=_label(rank))
            previous = None
            for v in VERSIONS:
                if rank == CORRUPT_RANK and v == CORRUPT_VERSION:
                    comm, real = rx._rx.comm, rx._rx.comm.broadcast

                    def corrupting(tensor, src, comm=comm, real=real):  # a transfer that half-arrived
                        real(tensor, src)
                        tensor[tensor.numel() // 2:] = 0
                        comm.broadcast = real

                    comm.broadcast = corrupting
                try:
                    version, got = rx.receive()
                except WeightSyncError as exc:
                    q.put(("recv-error", rank, v, type(exc).__name__, str(exc)))
                    continue
                want = _params(v)
                same = sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
                # buffers are reused in place: tensors returned last round now hold this round's values
                aliased = previous is not None and all(torch.equal(previous[k], got[k]) for k in got)
                q.put(("got", rank, version, same, aliased))
                previous = got
            rx.close()
        q.put(("communicators", rank, count[0]))
    except Exception as exc:  # noqa: BLE001 - surface anything unexpected to the test
        q.put(("crash", rank, repr(exc)))


@pytest.fixture(scope="module")
def rounds():
    # forkserver with torch preloaded: children fork from a clean, single-threaded server that imported
    # torch once, instead of three fresh interpreters importing it (seconds each on a loaded host)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "mindspeed_asp.integrations.mindspeed_rl.weight_transfer"])
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_member, args=(r, port, q)) for r in (1, 2, 0)]
    for p in procs:
        p.start()
    out = []
    deadline = time.monotonic() + 120
    while sum(1 for o in out if o[0] in ("communicators", "crash")) < 3 and time.monotonic() < deadline:
        try:
            out.append(q.get(timeout=1))
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    return out


def test_versions_arrive_bit_exact_through_groups_built_once(rounds):
    assert not [o for o in rounds if o[0] == "crash"], rounds
    ok_versions = [v for v in VERSIONS if v != CORRUPT_VERSION]
    for rank in (1, 2):
        got = [o for o in rounds if o[0] == "got" and o[1] == rank]
        expect = VERSIONS if rank != CORRUPT_RANK else ok_versions
        assert [g[2] for g in got] == list(expect)
        assert all(g[3] for g in got), got  # bit-exact, every name
        assert all(g[4] for g in got[1:]), got  # received into the previous round's buffers
    sent = {o[1]: o[2] for o in rounds if o[0] == "sent"}
    assert sorted(sent) == ok_versions
    nbytes = sum(t.numel() * t.element_size() for t in _params(1).values())
    for v, m in sent.items():
        assert m["weight_sync/version"] == v and m["weight_sync/bytes"] == nbytes
        assert m["weight_sync/tensors"] == 4 and m["weight_sync/buckets"] >= 2
        assert m["time/weight_sync"] >= m["weight_sync/send_seconds"] >= m["weight_sync/verify_seconds"] > 0
    assert sorted(o[1:] for o in rounds if o[0] == "communicators") == [(0, 1), (1, 1), (2, 1)]


def test_a_corrupted_transfer_fails_on_both_sides_naming_the_receiver(rounds):
    send_err = [o for o in rounds if o[0] == "send-error"]
    assert [(o[1], o[2]) for o in send_err] == [(CORRUPT_VERSION, "WeightSyncError")]
    assert _label(CORRUPT_RANK) in send_err[0][3] and "checksum mismatch" in send_err[0][3]
    assert _label(1) not in send_err[0][3]
    recv_err = [o for o in rounds if o[0] == "recv-error"]
    assert [(o[1], o[2], o[3]) for o in recv_err] == [(CORRUPT_RANK, CORRUPT_VERSION, "WeightSyncError")]
    assert _label(CORRUPT_RANK) in recv_err[0][4] and "checksum mismatch" in recv_err[0][4]


# ------------------------------------------------------------------------------------ deadlines
def _in_thread(fn):
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, box


def test_a_receiver_that_never_joins_is_named_within_the_deadline():
    port = free_port()
    th, box = _in_thread(lambda: WeightReceiver("gloo", "127.0.0.1", port, 1, 3, timeout_s=2, label=_label(1)))
    t0 = time.monotonic()
    with pytest.raises(WeightSyncTimeout, match=r"rank\(s\) 2 of 3 did not join within 2 s"):
        WeightSender("gloo", "127.0.0.1", port, world_size=3, timeout_s=2)
    assert time.monotonic() - t0 < 6
    th.join(15)
    assert isinstance(box.get("error"), WeightSyncError)  # the joined receiver does not hang either


def test_a_receiver_that_joins_but_never_receives_is_named():
    port = free_port()
    members = [_in_thread(lambda r=r: WeightReceiver("gloo", "127.0.0.1", port, r, 3, timeout_s=2,
                                                      label=_label(r))) for r in (1, 2)]
    sender = WeightSender("gloo", "127.0.0.1", port, world_size=3, timeout_s=2)
    for th, _ in members:
        th.join(15)
    rx1, rx2 = (box["value"] for _, box in members)
    th, box = _in_thread(rx1.receive)  # rank 2 never calls receive()
    t0 = time.monotonic()
    with pytest.raises(WeightSyncTimeout) as err:
        sender.send(1, _params(1).items())
    assert time.monotonic() - t0 < 6
    assert f"rank 2 ({_label(2)})" in str(err.value) and "never started receiving" in str(err.value)
    th.join(15)
    assert isinstance(box.get("error"), WeightSyncTimeout)  # rank 1 got the bytes but no checksums
    assert "weight sender" in str(box["error"])
    with pytest.raises(WeightSyncError, match="unusable"):  # a timed-out group is not reused silently
        sender.send(2, _params(2).items())
    for obj in (sender, rx1, rx2):
        obj.close()


def test_a_sender_that_never_sends_is_named_by_the_receiver():
    port = free_port()
    th, box = _in_thread(lambda: WeightSender("gloo", "127.0.0.1", port, world_size=2, timeout_s=2))
    rx = WeightReceiver("gloo", "127.0.0.1", port, 1, 2, timeout_s=1, label=_label(1))
    th.join(15)
    t0 = time.monotonic()
    with pytest.raises(WeightSyncTimeout, match=r"instance 0 tp-rank 0: rank 0 \(weight sender.*did not start"):
        rx.receive()
    assert time.monotonic() - t0 < 5
    rx.close()
    box["value"].close()


def test_backend_names_and_misuse():
    assert backend_platform("HCCL").kind == "npu" and backend_platform("nccl").kind == "cuda"
    assert backend_platform("gloo").dist_backend == "gloo"
    with pytest.raises(WeightSyncError, match="unknown weight-sync backend 'mpi'"):
        backend_platform("mpi")
    with pytest.raises(WeightSyncError, match="world_size 1"):
        WeightSender("gloo", "127.0.0.1", free_port(), world_size=1)


# --------------------------------------------------------------------------------- sync_deadline
@pytest.mark.slow
def test_sync_deadline_names_silent_and_failing_actors(local_ray):
    import ray

    @ray.remote
    def answer(value, delay=0.0, error=None):
        time.sleep(delay)
        if error == "timeout":
            raise WeightSyncTimeout("rank 0 did not start round 3")
        if error:
            raise ValueError(error)
        return value

    ray.get(answer.remote(0))  # a warm worker, so the deadlines below measure only the waits
    got = sync_deadline({"instance 0 tp-rank 0": answer.remote(7), "instance 1 tp-rank 0": answer.remote(8)},
                        timeout_s=60)
    assert got == {"instance 0 tp-rank 0": 7, "instance 1 tp-rank 0": 8}

    t0 = time.monotonic()
    with pytest.raises(WeightSyncTimeout) as err:
        sync_deadline({"instance 0 tp-rank 0": answer.remote(1), "instance 1 tp-rank 0": answer.remote(2, 30),
                       "instance 2 tp-rank 0": answer.remote(3, 30)}, timeout_s=3)
    assert time.monotonic() - t0 < 10
    assert "instance 1 tp-rank 0, instance 2 tp-rank 0" in str(err.value)
    assert "instance 0 tp-rank 0" not in str(err.value)

    with pytest.raises(WeightSyncTimeout, match="instance 1 tp-rank 0: .*did not start round 3"):
        sync_deadline({"instance 0 tp-rank 0": answer.remote(1),
                       "instance 1 tp-rank 0": answer.remote(0, error="timeout")}, timeout_s=60)
    with pytest.raises(WeightSyncError, match="instance 0 tp-rank 0: .*broken loader") as err:
        sync_deadline({"instance 0 tp-rank 0": answer.remote(0, error="broken loader")}, timeout_s=60)
    assert not isinstance(err.value, WeightSyncTimeout)
