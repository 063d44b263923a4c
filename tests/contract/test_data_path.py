"""The data-path patches against MindSpeed-RL's real TransferDock, PromptDataLoader and put_prompts_experience
on Ray CPU: each vLLM instance receives exactly its planned rows, in plan order.

Ray workers apply ASP's patches through a worker_process_setup_hook (msrl_shim.worker_setup, which calls
ASP's own `setup_hook.apply_all`), as `runtime_env.yaml` does on Ascend."""
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

HERE = Path(__file__).resolve().parent
N, GBS, M = 4, 8, 3


@pytest.fixture(scope="module")
def env(tmp_path_factory, msrl_src, no_ray_held):
    sys.path.insert(0, str(HERE))
    import msrl_shim
    msrl_shim.install()
    import ray
    from mindspeed_asp.integrations.mindspeed_rl.data_patches import prompt_set_from_dataset
    from mindspeed_asp.integrations.mindspeed_rl.patch_registry import PatchRegistry
    from mindspeed_asp.integrations.mindspeed_rl.setup_hook import register, selected_patches
    from mindspeed_asp.runtime.ray_utils import actor_env
    from mindspeed_asp.scheduler.build import plan_epoch

    tmp = tmp_path_factory.mktemp("msrl")
    rng = np.random.default_rng(0)
    dataset = [{"input_ids": (np.arange(int(rng.integers(3, 30))) + 1000 * i).astype(np.int64),
                "labels": np.array([i % 7], dtype=np.int64)} for i in range(24)]
    prompts = prompt_set_from_dataset(dataset, N)
    plan = plan_epoch(prompts, None, planner="asp", instances=M, slots=16, minibatch=GBS, max_new_tokens=512,
                      groups_per_iteration=GBS, max_lag=0, progress=False).plan  # the run's asp.max_lag
    plan.save(tmp / "plan.parquet")
    cfg = {
        "megatron_training": {"global_batch_size": GBS, "train_iters": 3, "seed": 1},
        "actor_config": {"tensor_model_parallel_size": 1},
        "rl_config": {"n_samples_per_prompt": N, "guarantee_order": True, "use_integrated_worker": True,
                      "blocking": True, "actor_resource": {"num_npus": M}, "actor_rollout_dispatch_size": N},
        "generate_config": {"infer_tensor_parallel_size": 1, "max_num_seqs": 64,
                            "sampling_config": {"max_tokens": 512}},
        "asp": {"mode": "colocated", "instances": M, "slots": 16, "minibatch_groups": GBS, "max_lag": 0,
                "plan_path": str(tmp / "plan.parquet")},
    }
    (tmp / "run.yaml").write_text(yaml.safe_dump(cfg))
    os.environ["ASP_MSRL_CONFIG"] = str(tmp / "run.yaml")
    registry = PatchRegistry()
    register(registry, selected_patches(["data"]))
    registry.apply_patches()  # this process plays MindSpeed-RL's `train` task
    env_vars = dict(actor_env())
    env_vars.update({"PYTHONPATH": os.pathsep.join([str(HERE), str(msrl_src), os.environ.get("PYTHONPATH", "")]),
                     "MINDSPEED_RL_SRC": str(msrl_src), "ASP_MSRL_CONFIG": str(tmp / "run.yaml")})
    ray.init(num_cpus=8, include_dashboard=False, object_store_memory=256 << 20, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": env_vars, "worker_process_setup_hook": "msrl_shim.worker_setup"})
    yield {"dataset": dataset, "plan": plan, "ray": ray, "registry": registry, "shim": msrl_shim}
    ray.shutdown()
    registry.remove_patches()
    os.environ.pop("ASP_MSRL_CONFIG", None)


def test_each_instance_receives_exactly_its_planned_rows_in_plan_order(env):
    ray, plan, dataset = env["ray"], env["plan"], env["dataset"]
    from mindspeed_rl.datasets.dataloader import PromptDataLoader
    from mindspeed_rl.trainer.utils import transfer_dock as td_mod
    from mindspeed_rl.utils.metrics import Metric
    from mindspeed_asp.integrations.mindspeed_rl.data_patches import (
        ASP_COLUMNS, PlanOrderedBatches, build_grpo_wrapper)

    def builder(self, prompts_num, n_samples_per_prompt, metrics, max_age, gbs_train, addition_columns=None,
                reuse_image_embeds=False, dataset_additional_keys=None):  # what DataStrategy.build_grpo does for td
        return td_mod.GRPOTransferDock.options(num_cpus=0).remote(
            prompts_num, n_samples_per_prompt, metrics=metrics, max_age=max_age, GBS_train=gbs_train,
            addition_columns=addition_columns)

    td = build_grpo_wrapper(builder)(None, prompts_num=GBS, n_samples_per_prompt=N, metrics=Metric(), max_age=1,
                                     gbs_train=GBS, addition_columns=["labels"], dataset_additional_keys=["labels"])
    cols = ray.get(td.get_experience_data.remote()).keys()
    assert set(ASP_COLUMNS) <= set(cols)

    loader = PromptDataLoader(dataset, GBS, 0, 1, ["labels"], True)  # MindSpeed-RL's loader, patched
    data_iters = iter(loader)
    assert isinstance(data_iters, PlanOrderedBatches)
    Leader = ray.remote(num_cpus=0)(env["shim"].Leader)
    leaders = [Leader.remote(j, M, N) for j in range(M)]
    seen = []
    for it in range(plan.num_iterations):
        batch = next(data_iters)
        # exactly as RayGRPOTrainer.fit: the (patched) put_prompts_experience, then put_experience(is_prompt)
        batch_dict, indexes = td_mod.put_prompts_experience(batch, N, ["labels"])
        assert indexes == list(range(GBS * N))
        ray.get(td.put_experience.remote(batch_dict, indexes, is_prompt=True))
        pulls = ray.get([ld.pull.remote(td, N) for ld in leaders])
        offset = 0
        for j, chunks in enumerate(pulls):
            queue = plan.instance_queue(it, j)
            rows = [r for c in chunks for r in c["index"]]
            assert rows == list(range(offset * N, (offset + len(queue)) * N))  # contiguous, in plan order
            offset += len(queue)
            assert [p for c in chunks for p in c["row_ids"]] == [int(p) for p in queue for _ in range(N)]
            generated = [p for c in chunks for p in c["prompts"]]  # one prompt per group, as vLLM gets them
            assert generated == [dataset[int(p)]["input_ids"].tolist() for p in queue]
            assert all(len(c["index"]) == N for c in chunks)  # chunks of exactly actor_rollout_dispatch_size
            seen += [int(p) for p in queue]
        status = ray.get(td.get_consumer_status.remote())
        assert int(status["actor_rollout"].sum()) == GBS * N  # every row pulled once, by its instance
        ray.get(td.clear.remote())
    assert sorted(seen) == list(range(len(dataset)))


def test_ray_workers_applied_the_patches_through_the_setup_hook(env):
    ray = env["ray"]

    @ray.remote(num_cpus=0)
    def probe():
        import sys as _sys
        from mindspeed_rl.trainer.utils import transfer_dock
        return (getattr(transfer_dock.put_prompts_experience, "__wrapped__", None) is not None,
                "mindspeed_llm" in _sys.modules)

    patched, llm_imported = ray.get(probe.remote())
    assert patched and not llm_imported


def test_async_trainer_rows_are_what_msrl_stages_read(env):
    """The async trainer writes finished groups with `put_groups`; MindSpeed-RL's reward and update stages
    read them back from the real TransferDock by their own column names."""
    import torch
    ray = env["ray"]
    from mindspeed_rl.trainer.utils import transfer_dock as td_mod
    from mindspeed_rl.utils.metrics import Metric
    from mindspeed_asp.integrations.mindspeed_rl.async_trainer import put_groups
    from mindspeed_asp.integrations.mindspeed_rl.data_patches import (
        ASP_PROMPT_ID, POLICY_VERSION, ROLLOUT_LOG_PROB, build_grpo_wrapper)
    from mindspeed_asp.runtime.requests import GroupResult, SampleResult

    def builder(self, prompts_num, n_samples_per_prompt, metrics, max_age, gbs_train, addition_columns=None,
                reuse_image_embeds=False, dataset_additional_keys=None):
        return td_mod.GRPOTransferDock.options(num_cpus=0).remote(
            prompts_num, n_samples_per_prompt, metrics=metrics, max_age=max_age, GBS_train=gbs_train,
            addition_columns=addition_columns)

    td = build_grpo_wrapper(builder)(None, prompts_num=GBS, n_samples_per_prompt=N, metrics=Metric(), max_age=1,
                                     gbs_train=GBS, addition_columns=["labels"], dataset_additional_keys=["labels"])
    rng = np.random.default_rng(1)
    dataset = env["dataset"]
    groups, extra = [], {}
    for k, pid in enumerate([5, 17, 2, 9, 11, 0, 23, 14]):
        resp = [list(rng.integers(2, 500, size=int(rng.integers(1, 20)))) for _ in range(N)]
        samples = [SampleResult([int(t) for t in r], list(-rng.random(len(r))), k % 2, k % 2, "stop") for r in resp]
        groups.append(GroupResult(str(100 + k), str(pid), k % M, samples, dataset[pid]["input_ids"].tolist(),
                                  0.0, 0.0, 1.0))
        extra[100 + k] = {"labels": torch.tensor(dataset[pid]["labels"]), ASP_PROMPT_ID: pid}
    indexes = put_groups(lambda d, i, p: ray.get(td.put_experience.remote(d, i, is_prompt=p)), groups, extra, N)
    assert indexes == list(range(GBS * N))
    reward, _ = ray.get(td.get_experience.remote("rule_reward", ["prompts", "responses", "response_length",
                                                                  "labels", "prompt_length"], indexes=indexes))
    train, _ = ray.get(td.get_experience.remote("actor_train", ["input_ids", "response_length", "prompt_length",
                                                                 ROLLOUT_LOG_PROB, POLICY_VERSION, ASP_PROMPT_ID],
                                                indexes=indexes))
    for row in indexes:
        g, s = groups[row // N], row % N
        L, P = int(reward["response_length"][row]), int(reward["prompt_length"][row])
        gid = int(g.group_id)
        assert reward["responses"][row][:L].tolist() == g.samples[s].token_ids
        assert reward["prompts"][row][:P].tolist() == g.prompt_token_ids
        assert int(reward["labels"][row][0]) == int(extra[gid]["labels"][0])
        assert train["input_ids"][row][:P + L].tolist() == g.prompt_token_ids + g.samples[s].token_ids
        assert torch.allclose(train[ROLLOUT_LOG_PROB][row][:L],
                              torch.tensor(g.samples[s].logprobs, dtype=torch.float32))
        assert int(train[POLICY_VERSION][row][0]) == g.min_version
        assert int(train[ASP_PROMPT_ID][row][0]) == extra[gid][ASP_PROMPT_ID]
