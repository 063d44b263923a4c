"""The weight-broadcast protocol (canary + per-tensor checksums) over real collectives: vLLM's
StatelessProcessGroup for metadata and a gloo group for tensors, in two processes. On Ascend the same
functions run over vllm-ascend's PyHcclCommunicator; a communicator that silently moves nothing is caught."""
import multiprocessing as mp
import socket

import pytest

from mindspeed_asp.errors import WeightSyncError


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _DeadComm:
    """What a disabled PyHccl/PyNccl communicator does: return without moving anything."""

    def broadcast(self, tensor, src):
        return None


def _rank(rank, meta_port, pg_port, q):
    try:
        import torch
        from vllm.distributed.utils import StatelessProcessGroup, stateless_init_torch_distributed_process_group
        from mindspeed_asp.errors import WeightSyncError
        from mindspeed_asp.integrations.mindspeed_rl.weight_transfer import TorchGroupComm, recv_state, send_state
        group = StatelessProcessGroup.create(host="127.0.0.1", port=meta_port, rank=rank, world_size=2)
        pg = stateless_init_torch_distributed_process_group("127.0.0.1", pg_port, rank, 2, backend="gloo")
        comm = TorchGroupComm(pg)
        torch.manual_seed(0)
        params = {"layers.0.qkv.weight": torch.randn(6, 4), "embed.weight": torch.randn(10, 4).to(torch.bfloat16)}
        if rank == 0:
            for v in (1, 2, 3):  # round 3: every rank's communicator is disabled (moves nothing)
                params = {k: t * v for k, t in params.items()}
                q.put(("sent", send_state(_DeadComm() if v == 3 else comm, group, params, src=0, version=v)))
            group.barrier()  # rank 0 hosts the TCPStore: stay until the receiver is done
        else:
            keep = {}
            for v in (1, 2, 3):
                try:
                    version, got = recv_state(_DeadComm() if v == 3 else comm, group, "cpu", src=0, keep=keep)
                except WeightSyncError as exc:
                    q.put(("error", str(exc)))
                    break
                scale = {1: 1, 2: 2}[v]  # the sender scales cumulatively: x1, then x2
                same = all(torch.equal(got[k], params[k] * scale) for k in got)
                reused = bool(keep) and all(got[k] is keep[k] for k in got)
                keep = got
                q.put(("got", version, sorted(got), same, reused))
            group.barrier()
    except Exception as exc:  # surface anything else to the test
        q.put(("crash", repr(exc)))


@pytest.fixture(scope="module")
def rounds():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ports = (_free_port(), _free_port())
    procs = [ctx.Process(target=_rank, args=(r, *ports, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    import queue
    out = []
    while len(out) < 5:  # 3 "sent"/"error" from rank 0, 2 "got" + 1 "error" from rank 1 (at least 5 before exit)
        try:
            out.append(q.get(timeout=180))
        except queue.Empty:
            break
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    while True:
        try:
            out.append(q.get(timeout=1))
        except queue.Empty:
            break
    return out


def test_two_rounds_arrive_with_matching_checksums_and_reused_buffers(rounds):
    out = rounds
    got = [o for o in out if o[0] == "got"]
    assert not [o for o in out if o[0] == "crash"], out
    assert [g[1] for g in got] == [1, 2]
    assert got[0][2] == ["embed.weight", "layers.0.qkv.weight"]
    assert all(g[3] for g in got)  # bit-exact tensors
    assert got[1][4]  # second round received into the first round's buffers (vLLM params stay aliased)
    sent = [o[1] for o in out if o[0] == "sent"]
    assert sent and sent[0] == 6 * 4 * 4 + 10 * 4 * 2


def test_a_communicator_that_moves_nothing_fails_loudly(rounds):
    out = rounds
    errors = [o for o in out if o[0] == "error"]
    assert errors and "moved nothing" in errors[0][1]
