"""vLLM worker extension: join the weight-sync group, receive bucketed HF-named tensors, load them.

vLLM mixes this class into whatever worker the platform uses (GPU, CPU, NPU) when the engine is built
with `worker_extension_cls="mindspeed_asp.runtime.worker_extension.AspWorkerExtension"`; the instance
actor calls its methods through `collective_rpc`, so with TP every worker of the instance runs them.

Loading goes through vLLM's layerwise reload (`initialize_layerwise_reload` -> `model.load_weights` ->
`finalize_layerwise_reload`), the same path vLLM's own weight-transfer engines use, because
`process_weights_after_loading` changes parameters after load: on CPU the linear layers are repacked
for oneDNN/SGL kernels and their `weight` parameters emptied, so a plain `load_weights` would write into
tensors the kernels no longer read. Checksums are taken of the tensors as received, per HF name, and
the set of vLLM parameters that `load_weights` filled is checked against the model's parameter list.
"""
from __future__ import annotations

import time
from typing import Any, Dict, Optional, Sequence

from mindspeed_asp.errors import WeightSyncError
from mindspeed_asp.runtime.platform import platform_from_name
from mindspeed_asp.runtime.weight_sync.buckets import (
    DEFAULT_BUCKET_BYTES,
    ManifestEntry,
    bucket_size,
    plan_buckets,
    unpack_bucket,
)
from mindspeed_asp.runtime.weight_sync.checksums import tensor_checksum
from mindspeed_asp.runtime.weight_sync.communicators import DEFAULT_TIMEOUT_S, Communicator, make_communicator


class AspWorkerExtension:
    """Methods injected into vLLM workers (they see `self.model_runner`, `self.device`, `self.rank`)."""

    _asp_comm: Optional[Communicator] = None
    _asp_checksums: Dict[str, float] = {}
    _asp_version: int = 0

    def _asp_model(self) -> Any:
        return self.model_runner.model  # type: ignore[attr-defined]

    def asp_init_weight_sync(self, platform_kind: str, master_addr: str, master_port: int, rank_offset: int,
                             world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> Dict[str, Any]:
        """Join the trainer's group as rank `rank_offset + tp_rank` (blocks until everyone joined)."""
        platform = platform_from_name(platform_kind)
        if self._asp_comm is not None:  # the group is being re-formed (e.g. after an instance died)
            self.asp_close_weight_sync()
        rank = int(rank_offset) + int(getattr(self, "rank", 0))
        device = getattr(self, "device", None) if platform.is_accelerator else None
        self._asp_comm = make_communicator(platform, master_addr, int(master_port), rank, int(world_size),
                                           device=device, timeout_s=timeout_s)
        self._asp_checksums = {}
        return {"rank": rank, "backend": platform.dist_backend}

    def asp_receive_weights(self, version: int, manifest: Sequence[ManifestEntry],
                            bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                            allow_partial: bool = False) -> Dict[str, Any]:
        """Receive every bucket of one round from rank 0 and load it; returns checksums and timings."""
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        if self._asp_comm is None:
            raise WeightSyncError("worker has not joined the weight-sync group (asp_init_weight_sync)")
        if not manifest:
            raise WeightSyncError(f"weight sync round for version {version} announces no tensors")
        t0 = time.perf_counter()
        model = self._asp_model()
        expected = {name for name, _ in model.named_parameters()}
        device = self.device if getattr(self, "device", None) is not None else torch.device("cpu")  # type: ignore
        loaded: set = set()
        checksums: Dict[str, float] = {}
        received = 0
        t_comm = 0.0
        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            initialize_layerwise_reload(model)
            try:
                for bucket in plan_buckets(list(manifest), int(bucket_bytes)):
                    flat = torch.empty(bucket_size(bucket), dtype=torch.uint8, device=device)
                    tc = time.perf_counter()
                    try:
                        self._asp_comm.broadcast(flat, src=0)
                    except Exception as exc:
                        raise WeightSyncError(f"weight broadcast failed on worker: {exc}") from exc
                    t_comm += time.perf_counter() - tc
                    pairs = unpack_bucket(flat, manifest, bucket)
                    for name, t in pairs:
                        checksums[name] = tensor_checksum(t)
                    received += flat.numel()
                    got = model.load_weights(weights=pairs)
                    if got:
                        loaded |= set(got)
            finally:
                finalize_layerwise_reload(model, self.model_config)  # type: ignore[attr-defined]
        missing = sorted(expected - loaded) if loaded else sorted(expected)
        if missing and not allow_partial:
            raise WeightSyncError(f"version {version}: the round left {len(missing)} engine parameters "
                                  f"unloaded, e.g. {missing[:4]}")
        engine_verified = self._asp_verify_engine_params(manifest, checksums, version)
        self._asp_checksums = checksums
        self._asp_version = int(version)
        return {"rank": int(getattr(self, "rank", 0)), "version": int(version), "bytes": received,
                "tensors": len(checksums), "loaded_params": len(loaded), "missing": missing,
                "engine_verified": engine_verified,
                "seconds": time.perf_counter() - t0, "comm_seconds": t_comm, "checksums": checksums}

    def _asp_verify_engine_params(self, manifest: Sequence[ManifestEntry], checksums: Dict[str, float],
                                  version: int) -> int:
        """Read back the parameters vLLM keeps under the HF name and shape (embeddings, norms, lm_head).

        Fused (qkv, gate_up) and repacked (CPU linear) weights cannot be read back, but these can: a
        load that silently did nothing shows up here, not only in the tests' logits comparison.
        """
        params = dict(self._asp_model().named_parameters())
        shapes = {name: tuple(shape) for name, shape, _ in manifest}
        n = 0
        for name, expect in checksums.items():
            p = params.get(name)
            if p is None or p.numel() == 0 or tuple(p.shape) != shapes.get(name) or p.is_meta:
                continue
            got = tensor_checksum(p.data)
            if not abs(got - expect) <= 1e-6 + 1e-6 * abs(expect):
                raise WeightSyncError(f"version {version}: {name} was received but the engine holds other "
                                      f"values after loading (checksum {got:.6g} != {expect:.6g})")
            n += 1
        return n

    def asp_weights_checksum(self) -> Dict[str, float]:
        """Checksums (per HF name) of the weights this worker received and loaded last."""
        return dict(self._asp_checksums)

    def asp_close_weight_sync(self) -> None:
        if self._asp_comm is not None:
            self._asp_comm.close()
            self._asp_comm = None
