"""Model-size and device presets for the cluster model (`sim/cluster.py`, `asp whatif`).

Why presets: the what-if question ("how many of my N devices should generate, how many train, and how much
faster than colocated stock?") needs a decode cost per tensor-parallel degree, a KV budget, a training speed
per device and the bytes a weight sync moves, for models nobody has measured on this machine. Every number
here either names the published figure it comes from or is derived by a stated formula from stated
assumptions (`source` strings); `asp fit-cost` output and a MindSpeed-RL log override them
(`commands/whatif.py`, `--cost-file`, `--calibrate-log`).

Decode cost of one step on an instance of TP devices (docs/simulator.md, "Cluster model"):

    a(TP) = step_overhead + weight_bytes / (TP * hbm_bw * eta_mem) + 2 * layers * allreduce_s * [TP > 1]
    b(TP) = 2 * active_params / (TP * peak_flops * eta_flop)          (one token's matmuls)
    c(TP) = kv_bytes_per_token / (TP * hbm_bw * eta_mem)              (reading one resident KV token)
    p(TP) = 2 * active_params / (TP * peak_flops * eta_prefill)       (one prompt token's prefill)

KV budget of one instance: (TP * hbm_bytes * mem_util - weight_bytes) / kv_bytes_per_token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

from mindspeed_asp.errors import InputError
from mindspeed_asp.core.problem import CostModel

GB = 1e9


@dataclass(frozen=True)
class Device:
    """One accelerator (an Ascend NPU, or one die of an A3 chip); every value is an assumption with a source."""

    name: str
    hbm_bytes: float
    hbm_bw: float  # bytes/s
    peak_flops: float  # dense BF16 FLOP/s
    eta_mem: float = 0.6  # achieved share of the HBM bandwidth in decode
    eta_flop: float = 0.4  # achieved share of the peak in decode matmuls
    eta_prefill: float = 0.5  # achieved share of the peak in prefill
    step_overhead_s: float = 0.012  # scheduler + launch per decode step (vLLM-Ascend, assumed)
    allreduce_s: float = 2.0e-5  # one TP all-reduce of a decode step's activations
    sync_bw: float = 25 * GB  # trainer -> instances weight broadcast, effective bytes/s
    reshard_bw: float = 25 * GB  # colocated train <-> infer layout switch, effective bytes/s
    host_bw: float = 20 * GB  # device <-> host offload of optimizer/grad state per device
    source: str = ""


A3_DIE = Device(
    name="A3", hbm_bytes=64 * GB, hbm_bw=1.6e12, peak_flops=3.0e14,
    source="assumed per die of an Atlas 900 A3 (Ascend 910C: two dies per chip, 128 GB HBM per chip): "
           "64 GB and 1.6 TB/s HBM, 300 TFLOP/s BF16 per die, i.e. the 910B-class figures; efficiencies "
           "eta_mem 0.6, eta_flop 0.4, eta_prefill 0.5, 12 ms per-step overhead, 25 GB/s sync and reshard, "
           "20 GB/s host offload are assumptions")
A2_NPU = Device(
    name="A2", hbm_bytes=64 * GB, hbm_bw=1.6e12, peak_flops=3.0e14,
    source="assumed per Ascend 910B NPU of an Atlas 800T A2: 64 GB, 1.6 TB/s HBM, 300 TFLOP/s BF16 "
           "(rounded public 910B figures); the same efficiency assumptions as A3")
DEVICES: Dict[str, Device] = {"A3": A3_DIE, "A2": A2_NPU}

_LLM_README = ("MindSpeed-LLM README pretraining table (tokens/p/s, Atlas 900 A2 PODc, mc2 on)")


@dataclass(frozen=True)
class ModelPreset:
    """One model: its size (for the decode-cost formulas and the sync bytes) and its training speed."""

    name: str
    params: float  # total parameters
    active_params: float  # parameters a token passes through (= params for dense models)
    layers: int
    kv_heads: int
    head_dim: int
    train_tokens_per_s: float  # forward + backward tokens per second per device
    train_source: str
    size_source: str
    moe: bool = False

    @property
    def weight_bytes(self) -> float:
        """BF16 weights: the bytes one decode step reads and one weight sync moves."""
        return 2.0 * self.params

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer, BF16."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2.0

    def decode_cost(self, tp: int, device: Device) -> CostModel:
        """The decode step cost of one instance of `tp` devices (module docstring's formulas)."""
        if tp < 1:
            raise InputError(f"tensor-parallel degree must be >= 1, got {tp}", key="tp")
        bw, fl = tp * device.hbm_bw, tp * device.peak_flops
        a = device.step_overhead_s + self.weight_bytes / (bw * device.eta_mem) + \
            (2 * self.layers * device.allreduce_s if tp > 1 else 0.0)
        b = 2.0 * self.active_params / (fl * device.eta_flop)
        c = self.kv_bytes_per_token / (bw * device.eta_mem)
        p = 2.0 * self.active_params / (fl * device.eta_prefill)
        return CostModel(a=a, b=b, c=c, p=p, source=f"preset {self.name} on {device.name}, TP{tp}: roofline "
                         "formulas of mindspeed_asp/sim/model_presets.py (weights, KV bytes, FLOPs / device "
                         "bandwidth and peak x efficiency)")

    def kv_budget(self, tp: int, device: Device, mem_util: float) -> int:
        """KV tokens one instance of `tp` devices holds at `mem_util` of its HBM (0 when the weights don't fit)."""
        free = tp * device.hbm_bytes * mem_util - self.weight_bytes
        return max(0, int(free / self.kv_bytes_per_token))

    def min_tp(self, device: Device, mem_util: float) -> int:
        """The smallest power-of-two TP whose instance holds the weights and 16k KV tokens."""
        tp = 1
        while self.kv_budget(tp, device, mem_util) < 16384 and tp < 64:
            tp *= 2
        return tp


PRESETS: Dict[str, ModelPreset] = {
    "qwen25_7b": ModelPreset(
        name="qwen25_7b", params=7.62e9, active_params=7.62e9, layers=28, kv_heads=4, head_dim=128,
        train_tokens_per_s=4034.0,
        train_source=f"Qwen2-7B, 4K sequence, 1x8: 4034 tokens/p/s, {_LLM_README}; Qwen2.5-7B has the same "
                     "architecture; RL sequences and A3 dies assumed to train at the same rate",
        size_source="Qwen2.5-7B config.json: 7.62B parameters, 28 layers, 4 KV heads x 128"),
    "qwen25_32b": ModelPreset(
        name="qwen25_32b", params=32.8e9, active_params=32.8e9, layers=64, kv_heads=8, head_dim=128,
        train_tokens_per_s=751.0,
        train_source=f"Qwen1.5-32B, 8K sequence, 4x8: 751 tokens/p/s, {_LLM_README}; Qwen2.5-32B assumed "
                     "to train at the same rate (similar size)",
        size_source="Qwen2.5-32B config.json: 32.8B parameters, 64 layers, 8 KV heads x 128"),
    "qwen3_8b": ModelPreset(
        name="qwen3_8b", params=8.19e9, active_params=8.19e9, layers=36, kv_heads=8, head_dim=128,
        train_tokens_per_s=4034.0 * 7.62 / 8.19,
        train_source=f"estimated: Qwen2-7B's 4034 tokens/p/s ({_LLM_README}) x 7.62/8.19 "
                     "(tokens/s scale inversely with parameters)",
        size_source="Qwen3-8B config.json: 8.19B parameters, 36 layers, 8 KV heads x 128"),
    "qwen3_30b_a3b": ModelPreset(
        name="qwen3_30b_a3b", params=30.5e9, active_params=3.3e9, layers=48, kv_heads=4, head_dim=128,
        train_tokens_per_s=4034.0 * 7.62 / 3.3 * 0.5, moe=True,
        train_source=f"estimated: Qwen2-7B's 4034 tokens/p/s ({_LLM_README}) x 7.62/3.3 (active "
                     "parameters) x 0.5 (assumed MoE efficiency: routing, all-to-all, expert imbalance)",
        size_source="Qwen3-30B-A3B config.json: 30.5B parameters, 3.3B active, 48 layers, 4 KV heads x 128; "
                    "a decode step is assumed to read every expert (large batches touch them all)"),
}

#: The MindSpeed-RL `model:` names of configs/*.yaml -> preset names.
CONFIG_MODELS: Dict[str, str] = {"qwen25_7b": "qwen25_7b", "qwen25_32b": "qwen25_32b", "qwen3_8b": "qwen3_8b",
                                 "qwen3_30b_a3b": "qwen3_30b_a3b"}


def get_preset(name: str) -> ModelPreset:
    """A preset by name (error names --model and the choices)."""
    key = name.strip().lower().replace("-", "_").replace(".", "")
    key = {"qwen257b": "qwen25_7b", "qwen2_5_7b": "qwen25_7b", "qwen2532b": "qwen25_32b",
           "qwen2_5_32b": "qwen25_32b"}.get(key, key)
    if key not in PRESETS:
        raise InputError(f"unknown model preset {name!r}; choose from {', '.join(PRESETS)}", key="--model")
    return PRESETS[key]


def get_device(name: str) -> Device:
    if name not in DEVICES:
        raise InputError(f"unknown device {name!r}; choose from {', '.join(DEVICES)}", key="--device")
    return DEVICES[name]


def describe(preset: ModelPreset, device: Device, tps: Tuple[int, ...] = (1, 2, 4, 8)) -> Dict[str, object]:
    """JSON-ready view of a preset on a device: its costs per TP and every source."""
    costs = {}
    for tp in tps:
        c = preset.decode_cost(tp, device)
        costs[f"tp{tp}"] = {"a": c.a, "b": c.b, "c": c.c, "p": c.p,
                            "kv_budget_at_0.9": preset.kv_budget(tp, device, 0.9)}
    return {"model": preset.name, "device": device.name, "weight_bytes": preset.weight_bytes,
            "kv_bytes_per_token": preset.kv_bytes_per_token, "train_tokens_per_s_per_device":
            preset.train_tokens_per_s, "decode": costs,
            "sources": {"size": preset.size_source, "train": preset.train_source, "device": device.source}}

