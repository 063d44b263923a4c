"""Trainer -> rollout-instance weight sync over one collective group (gloo on CPU, NCCL on GPU, HCCL on NPU).

Why one group: the trainer's sending rank (rank 0) and every vLLM worker of every instance join a single
group (OpenRLHF/vLLM NCCL-engine topology: instance i's workers sit at `rank_offset_i + tp_rank`), so a
round is one broadcast per bucket, whatever the number of instances, and NPU hosts hold one set of HCCL
buffers. The same bucket plan is computed on both sides from a manifest of HF names, shapes and dtypes,
so only tensor bytes travel through the collective.

Every round is checked: vLLM's PyNcclCommunicator and vllm-ascend's PyHcclCommunicator turn every
collective into a silent no-op when their library is missing, so a communicator that is disabled, a
round that moves no tensor, a collective that fails, or a receiver whose checksums differ from the
sender's raises `WeightSyncError`; a peer that does not answer within the deadline (joining the group,
a broadcast, a verdict) raises `WeightSyncTimeout`, naming the ranks and labels it waited for.

Modules, one job each (imports point down this list only):

- `checksums`: `tensor_checksum` (bounded-memory, position-weighted), `checksums_match`; torch only.
- `buckets`: the manifest and `plan_buckets` / `pack_bucket` / `unpack_bucket`; torch only.
- `group_store`: the control plane, a TCPStore hosted by rank 0 (`free_port`, `host_store`, joining,
  waiting for keys, the announced rounds' keys).
- `communicators`: `make_communicator`, the three backends behind one `broadcast(tensor, src)` with a
  deadline.
- `sender`: the trainer-side `WeightSyncSender` (init / start / send_bucket / finish / close, plus `send`
  for a whole round) and `SyncStats`.
- `receiver`: the in-process `WeightSyncReceiver` of announced rounds.
- `instance_sync`: `init_weight_sync` / `sync_weights`, which drive the sender and the vLLM instance
  actors concurrently (the only module that imports Ray).

Nothing is re-exported here: callers import each name from the module that defines it, so a name has
one home (a test that patches it, or a doc that cites it, names that module), and a worker that needs
only the checksum or the bucket plan loads nothing of the communicators or Ray.
"""
