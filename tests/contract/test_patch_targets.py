"""Every patch target and every MindSpeed-RL API the integration calls exists at the pinned commit with the
signature the patch expects. Read from the source with `ast`: nothing is imported."""
import ast
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
import yaml

from mindspeed_asp.integrations.mindspeed_rl.async_trainer import TRAINER_PATCHES
from mindspeed_asp.integrations.mindspeed_rl.data_patches import (
    DATA_PATCHES, DOCK_PATCHES, REWARD_PATCHES, ROW_PATCHES)
from mindspeed_asp.integrations.mindspeed_rl.loss_patch import LOSS_PATCHES
from mindspeed_asp.integrations.mindspeed_rl.pins import MINDSPEED_RL_COMMIT
from mindspeed_asp.integrations.mindspeed_rl.resume_state import CHECKPOINT_PATCHES

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def module_file(src: Path, dotted: str) -> Tuple[Path, List[str]]:
    """The .py file of the longest module prefix of `dotted`, and the remaining attribute path."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = src.joinpath(*parts[:i])
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py"), parts[i:]
        if (base / "__init__.py").is_file() and i < len(parts) and not base.joinpath(parts[i]).exists() \
                and not base.joinpath(parts[i] + ".py").exists():
            return base / "__init__.py", parts[i:]
    raise AssertionError(f"no module file for {dotted}")


def find(src: Path, dotted: str):
    path, rest = module_file(src, dotted)
    node = ast.parse(path.read_text())
    for name in rest:
        body = getattr(node, "body", [])
        hit = [n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
               and n.name == name]
        if not hit:
            return None
        node = hit[0]
    return node


def signature(fn: ast.FunctionDef) -> Tuple[List[str], Dict[str, str], Optional[str], Optional[str]]:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args]
    defaults = {}
    for arg, d in zip(reversed(a.args), reversed(a.defaults)):
        defaults[arg.arg] = ast.unparse(d)
    return names, defaults, a.vararg.arg if a.vararg else None, a.kwarg.arg if a.kwarg else None


# What each patch (and each API the integration calls) expects: positional names and defaults.
EXPECTED = {
    "mindspeed_rl.trainer.utils.transfer_dock.put_prompts_experience":
        (["batch", "n_samples_per_prompt", "dataset_additional_keys", "indexes", "add_another_batch"],
         {"dataset_additional_keys": "None", "indexes": "None", "add_another_batch": "False"}),
    "mindspeed_rl.trainer.utils.data_strategy.DataStrategy.build_grpo":
        (["self", "prompts_num", "n_samples_per_prompt", "metrics", "max_age", "gbs_train", "addition_columns",
          "reuse_image_embeds", "dataset_additional_keys"], {"addition_columns": "None"}),
    "mindspeed_rl.trainer.utils.data_strategy.DataStrategy.build_dapo":
        (["self", "should_filter", "max_num_prompt_in_batch", "td_max_len", "n_samples_per_prompt", "metrics",
          "max_age", "gbs_train", "addition_columns", "addition_consumers", "dataset_additional_keys"], {}),
    "mindspeed_rl.workers.base_worker.BaseWorker.get_dp_range_indexes":
        (["self", "experience_count", "use_vllm", "assign_batch_size"],
         {"use_vllm": "False", "assign_batch_size": "None"}),
    "mindspeed_rl.datasets.dataloader.PromptDataLoader.__init__":
        (["self", "dataset", "global_batch_size", "num_workers", "seed", "dataset_additional_keys", "no_shuffle"], {}),
    "mindspeed_rl.trainer.base.RayBaseTrainer.__init__":
        (["self", "actor_worker", "ref_worker", "reward_list"], {"reward_list": "None"}),
    "mindspeed_rl.workers.rule_reward.RuleReward.compute_rm_score": (["self"], {}),
    "mindspeed_rl.workers.rule_reward.RuleReward.initialize":
        (["self", "megatron_config", "rl_config", "tokenizer", "trust_remote_code", "dp_rank"], {}),
    "mindspeed_rl.trainer.grpo_trainer_hybrid.RayGRPOTrainer.fit": (["self", "data_iters"], {}),
    # APIs called by the async trainer, the rollout worker and the weight sender
    "mindspeed_rl.workers.base_worker.BaseWorker.get_vllm_dp_rank": ([], {}),
    "mindspeed_rl.trainer.grpo_trainer_hybrid.RayGRPOTrainer.compute_advantage":
        (["self", "blocking", "guarantee_order"], {}),
    "mindspeed_rl.trainer.grpo_trainer_hybrid.RayGRPOTrainer.save_checkpoint": (["self", "iteration"], {}),
    "mindspeed_rl.trainer.utils.transfer_dock.GRPOTransferDock.put_experience":
        (["self", "data_dict", "indexes", "is_prompt"], {}),
    "mindspeed_rl.trainer.utils.transfer_dock.GRPOTransferDock.get_experience":
        (["self", "consumer", "experience_columns", "experience_count", "dp_size", "indexes", "get_n_samples"], {}),
    "mindspeed_rl.trainer.utils.data_strategy.DataStrategy.put_experience": (["self"], {}),
    "mindspeed_rl.trainer.utils.data_strategy.DataStrategy.update_metrics": (["self"], {}),
    "mindspeed_rl.trainer.utils.data_strategy.DataStrategy.clear_main": (["self"], {}),
    "mindspeed_rl.trainer.utils.data_strategy.DataStrategy.get_metrics": (["self"], {}),
    "mindspeed_rl.trainer.utils.compute_utils.compute_grpo_data_metrics":
        (["td", "experience_count", "tokenizer", "global_batch_size", "guarantee_order"], {}),
    "mindspeed_rl.utils.utils.compute_tps":
        (["compute_kwargs", "metrics_result", "gbs", "n_samples", "time_all", "log_max_throughput"], {}),
    "mindspeed_rl.utils.utils.metrics_post_processing": (["metrics"], {}),
    "mindspeed_rl.utils.utils.metrics_sort": (["metrics", "time_all"], {}),
    "mindspeed_rl.utils.utils.get_current_dp_range_indexes":
        (["experience_count", "assign_batch_size", "current_dp_rank"], {}),
    "mindspeed_rl.utils.pad_process.padding_dict_to_tensor_dict": (["experience_data"], {}),
    "mindspeed_rl.utils.loggers.Loggers.info": (["self", "msg", "iteration", "steps"], {}),
    "mindspeed_rl.workers.scheduler.launcher.RayActorGroup.execute_async_command": (["self", "method_name"], {}),
    "mindspeed_rl.workers.scheduler.launcher.RayActorGroup.update": (["self", "kl_ctrl", "skip_actor_log_prob"], {}),
    "mindspeed_rl.workers.scheduler.launcher.RayActorGroup.compute_log_prob": (["self", "blocking"], {}),
    "mindspeed_rl.workers.scheduler.launcher.RayActorGroup.compute_ref_log_prob": (["self", "blocking"], {}),
    "mindspeed_rl.workers.scheduler.launcher.RayActorGroup.compute_rm_score": (["self", "blocking"], {}),
    "mindspeed_rl.workers.scheduler.launcher.RayActorGroup.get_iteration": (["self"], {}),
    "mindspeed_rl.workers.scheduler.launcher.RayActorGroup.get_consumed_train_samples": (["self"], {}),
    "mindspeed_rl.workers.scheduler.launcher.RayActorGroup.wait_all_ref_objs_run_over": (["self"], {}),
    "mindspeed_rl.workers.resharding.megatron_sharding_manager.MegatronShardingManager.onload_infer_params":
        (["self"], {}),
    "mindspeed_rl.workers.resharding.megatron_sharding_manager.MegatronShardingManager.offload_infer_params":
        (["self"], {}),
    "mindspeed_rl.workers.resharding.vllm_weight_container.MegatronStyleVllmWeightContainer.get_infer_params":
        (["self"], {}),
    "mindspeed_rl.models.rollout.vllm_engine.VLLMInferEngine.sync_model_weights":
        (["self", "params", "load_format"], {"load_format": "'megatron'"}),
    "mindspeed_rl.models.rollout.vllm_engine.VLLMInferEngine.init_cache_engine": (["self"], {}),
    "mindspeed_rl.models.rollout.vllm_engine.VLLMInferEngine.__init__":
        (["self", "tokenizer_name_or_path", "train_tensor_parallel_size", "train_pipeline_parallel_size",
          "train_expert_parallel_size", "train_context_parallel_size", "infer_tensor_parallel_size",
          "infer_pipeline_parallel_size", "infer_expert_parallel_size", "sampling_config"], {}),
}


def test_checkout_is_the_pinned_commit(msrl_src):
    from mindspeed_asp.integrations.mindspeed_rl.pins import installed_mindspeed_rl_commit
    commit = installed_mindspeed_rl_commit(str(msrl_src))
    if commit is None:
        pytest.skip("checkout without .git: commit cannot be read (set ASP_MINDSPEED_RL_COMMIT to state it)")
    assert MINDSPEED_RL_COMMIT.startswith(commit[:7]) or commit == MINDSPEED_RL_COMMIT


@pytest.mark.parametrize("target", [t for t, _ in DATA_PATCHES + DOCK_PATCHES + ROW_PATCHES + REWARD_PATCHES
                                    + TRAINER_PATCHES + LOSS_PATCHES + CHECKPOINT_PATCHES])
def test_every_patch_target_exists(msrl_src, target):
    owner, _, leaf = target.rpartition(".")
    cls = find(msrl_src, owner)
    if leaf.startswith("asp_"):  # a method ASP adds: its class must exist and not define it already
        assert isinstance(cls, ast.ClassDef), f"{owner} not found"
        assert find(msrl_src, target) is None
        return
    if leaf == "__iter__":  # PromptDataLoader inherits it from torch's DataLoader
        assert isinstance(cls, ast.ClassDef) and any(ast.unparse(b).endswith("DataLoader") for b in cls.bases)
        return
    assert find(msrl_src, target) is not None, f"{target} missing at the pinned commit"


@pytest.mark.parametrize("target", sorted(EXPECTED))
def test_signatures_match_what_asp_calls(msrl_src, target):
    node = find(msrl_src, target)
    assert isinstance(node, ast.FunctionDef), f"{target} missing"
    names, defaults, _, _ = signature(node)
    want, want_defaults = EXPECTED[target]
    assert names[:len(want)] == want, f"{target}: {names}"
    for k, v in want_defaults.items():
        assert defaults.get(k) == v, f"{target}: default of {k} is {defaults.get(k)}"


def test_get_vllm_dp_rank_is_static_and_returns_rank_and_size(msrl_src):
    node = find(msrl_src, "mindspeed_rl.workers.base_worker.BaseWorker.get_vllm_dp_rank")
    assert any(ast.unparse(d) == "staticmethod" for d in node.decorator_list)
    ret = [n for n in ast.walk(node) if isinstance(n, ast.Return)][-1]
    assert isinstance(ret.value, ast.Tuple) and len(ret.value.elts) == 2


def test_generate_path_pulls_exact_chunks_from_get_dp_range_indexes(msrl_src):
    """The row contract the plan relies on: guarantee_order pops whole chunks, and the sync generate path
    indexes one prompt per n rows, so every chunk must hold exactly actor_rollout_dispatch_size rows."""
    base = "mindspeed_rl.workers.actor_hybrid_worker.ActorHybridWorkerBase"
    gen = ast.unparse(find(msrl_src, f"{base}.generate_sequences"))
    assert "self.get_dp_range_indexes(experience_count, use_vllm=True) if self.rl_config.guarantee_order" in gen
    assert "sorted_indexes.pop(0) if self.rl_config.guarantee_order" in gen
    sync = ast.unparse(find(msrl_src, f"{base}.sync_generate_process"))
    assert "range(0, experience_count, self.rl_config.n_samples_per_prompt)" in sync
    consumed = ast.unparse(find(msrl_src, "mindspeed_rl.workers.base_worker.BaseWorker.all_consumed"))
    assert "self.rl_config.guarantee_order and (not sorted_indexes)" in consumed


def test_rule_reward_loop_is_what_the_reward_patch_relies_on(msrl_src):
    """REWARD_PATCHES run stock `compute_rm_score` with guarantee_order off (the dock's locked sampler) from a
    trainer-held handle: the class must stay a @ray.remote actor (so `__ray_call__` exists and a hook-patched
    method would not reach it), read both settings from `self.rl_config`, and every trainer must keep its
    reward handles in `RayBaseTrainer.reward_list`."""
    cls = find(msrl_src, "mindspeed_rl.workers.rule_reward.RuleReward")
    assert [ast.unparse(d) for d in cls.decorator_list] == ["ray.remote"]
    body = ast.unparse(find(msrl_src, "mindspeed_rl.workers.rule_reward.RuleReward.compute_rm_score"))
    assert "experience_count = self.rl_config.reward_dispatch_size" in body
    assert "if self.rl_config.guarantee_order else None" in body
    assert "while not ray.get(cur_td.all_consumed.remote(experience_consumer_stage))" in body
    assert "self.megatron_config.global_batch_size * self.rl_config.n_samples_per_prompt" in body
    init = ast.unparse(find(msrl_src, "mindspeed_rl.trainer.base.RayBaseTrainer.__init__"))
    assert "self.reward_list = reward_list" in init
    for trainer in ("grpo_trainer_hybrid", "dapo_trainer_hybrid", "ppo_trainer_hybrid"):
        text = (msrl_src / "mindspeed_rl" / "trainer" / f"{trainer}.py").read_text()
        assert "rule_reward.append(reward_worker.compute_rm_score.remote())" in text


def test_stock_vllm_engine_retokenises_decoded_prompts(msrl_src):
    """docs/ascend.md (prompt tokens): stock decodes prompt ids with skip_special_tokens=True and lets vLLM
    tokenise the text again; ASP's rollout pool sends the ids themselves."""
    gen = ast.unparse(find(msrl_src, "mindspeed_rl.models.rollout.vllm_engine.VLLMInferEngine.generate_sequences"))
    assert "self.tokenizer.tokenizer.decode(p, skip_special_tokens=True)" in gen
    assert "self.llm.generate(prompts=prompts" in gen


def test_prompt_loader_shuffles_with_the_seed(msrl_src):
    """loader_order reads the loader's own sampler: RandomSampler on a generator seeded with `seed` unless
    no_shuffle, SequentialSampler otherwise (what export_prompts.py and the plan-ordered loader rely on)."""
    init = ast.unparse(find(msrl_src, "mindspeed_rl.datasets.dataloader.PromptDataLoader.__init__"))
    assert "train_dataloader_generator.manual_seed(seed)" in init
    assert "RandomSampler(data_source=dataset, generator=train_dataloader_generator)" in init
    assert "SequentialSampler(data_source=dataset)" in init and "sampler=sampler" in init
    assert "drop_last=True" in init


def test_train_cli_reads_runtime_env_path_and_builds_grpo_trainer(msrl_src):
    text = (msrl_src / "cli" / "train_grpo.py").read_text()
    assert "os.path.join(cur_file_dir, rl_config.runtime_env_path)" in text  # an absolute path wins
    assert "ray.init(runtime_env=runtime_env)" in text
    assert 'runtime_env["env_vars"]' in text  # our runtime_env.yaml must keep an env_vars block
    assert "RayGRPOTrainer(" in text and "trainer.fit(data_iters)" in text
    assert "PromptDataLoader(" in text and "data_iters = iter(data_loader)" in text
    hook_env = yaml.safe_load((Path(__file__).resolve().parents[2] / "mindspeed_asp" / "integrations" /
                               "mindspeed_rl" / "runtime_env.yaml").read_text())
    stock_env = yaml.safe_load((msrl_src / "configs" / "envs" / "runtime_env.yaml").read_text())
    # Ray's runtime_env overrides the environment the workers inherit from `ray start`: values that must
    # differ between jobs sharing a node are left to the launching environment (shell/msrl_common.sh).
    pass_through = {"HCCL_IF_BASE_PORT", "LCAL_COMM_ID"}
    assert set(stock_env["env_vars"]) - pass_through <= set(hook_env["env_vars"])
    assert not pass_through & set(hook_env["env_vars"])


def test_resume_is_what_asps_checkpoint_state_relies_on(msrl_src):
    """resume_state.py: the trainer saves through `save_checkpoint(iteration)` (after its update, at
    `save_interval` and at the end), every actor rank saves before it returns, and on resume the launcher skips
    `consumed_train_samples // global_batch_size` loader batches and `fit` starts at the loaded iteration."""
    fit = ast.unparse(find(msrl_src, "mindspeed_rl.trainer.grpo_trainer_hybrid.RayGRPOTrainer.fit"))
    assert "iteration = self.actor_worker.get_iteration()" in fit
    assert "if iteration % self.save_interval == 0 or iteration == self.train_iters:" in fit
    assert "self.save_checkpoint(iteration)" in fit
    save = ast.unparse(find(msrl_src, "mindspeed_rl.workers.scheduler.launcher.RayActorGroup.save_checkpoint"))
    assert "actor.save_ckpt.remote(iteration)" in save and "return ray.get(actor_train_objs)" in save
    text = (msrl_src / "cli" / "train_grpo.py").read_text()
    assert "consumed_train_samples = actor_worker.get_consumed_train_samples()" in text
    assert "[next(data_iters) for _ in range(consumed_train_samples // actor_config.global_batch_size)]" in text
    assert {"load", "save"} <= _config_attrs(msrl_src, "mindspeed_rl.config_cls.megatron_config.MegatronConfig")


def _config_attrs(msrl_src: Path, cls_path: str) -> set:
    cls = find(msrl_src, cls_path)
    names = set()
    for n in ast.walk(cls):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


@pytest.mark.parametrize("config", sorted(p.name for p in CONFIGS.glob("*_asp.yaml")))
def test_config_keys_exist_in_mindspeed_rl_config_classes(msrl_src, config):
    """BaseConfig.update raises on any key that is not a declared attribute; check ours before a run does."""
    data = yaml.safe_load((CONFIGS / config).read_text())
    stock = {"qwen25_7b_A3_asp.yaml": "grpo_qwen25_7b_A3", "qwen25_32b_A3_asp.yaml": "grpo_qwen25_32b_A3",
             "qwen25_32b_A2_asp.yaml": "grpo_qwen25_32b_A2", "qwen3_8b_A3_asp.yaml": "grpo_qwen3_8b_A3",
             "qwen3_30b_a3b_dapo_A3_asp.yaml": "dapo_qwen3_30b_a3b_A3"}[config]
    base = yaml.safe_load((msrl_src / "configs" / f"{stock}.yaml").read_text())
    rl = _config_attrs(msrl_src, "mindspeed_rl.config_cls.rl_config.RLConfig")
    gen = _config_attrs(msrl_src, "mindspeed_rl.config_cls.generate_config.GenerateConfig")
    meg = _config_attrs(msrl_src, "mindspeed_rl.config_cls.megatron_config.MegatronConfig")
    assert not set(data["rl_config"]) - rl, set(data["rl_config"]) - rl
    assert not set(data["generate_config"]) - gen, set(data["generate_config"]) - gen
    keys = set(data["megatron_training"]) | set(data["actor_config"])
    known = meg | set(base["megatron_training"]) | set(base["actor_config"])  # e.g. `model`, read by the loader
    assert not keys - known, keys - known
    added = ((set(data["rl_config"]) - set(base["rl_config"]))
             | (set(data["generate_config"]) - set(base["generate_config"])))
    assert added <= rl | gen  # everything ASP adds to MindSpeed-RL's sections is a declared attribute
    sampling = find(msrl_src, "mindspeed_rl.config_cls.generate_config.GenerateConfig.__init__")
    sampling_keys = {k.value for n in ast.walk(sampling) if isinstance(n, ast.Dict)
                     for k in n.keys if isinstance(k, ast.Constant)}
    assert not set(data["generate_config"]["sampling_config"]) - sampling_keys
    assert data["defaults"] == base["defaults"] and data["megatron_training"] == base["megatron_training"]


ATTRIBUTES = {  # attributes the async trainer, the weight sender and the rollout worker read
    "mindspeed_rl.workers.scheduler.launcher.RayActorGroup": {"generate_config", "megatron_config", "actor_handlers",
                                                              "rl_config"},
    "mindspeed_rl.trainer.base.RayBaseTrainer": {"actor_worker", "ref_worker", "reward_list", "kl_ctrl", "blocking",
                                                 "guarantee_order", "train_iters", "save_interval", "tensorboard",
                                                 "tokenizer"},
    "mindspeed_rl.trainer.grpo_trainer_hybrid.RayGRPOTrainer": {"data_strategy", "transfer_dock", "kwargs",
                                                                "skip_actor_log_prob"},
    "mindspeed_rl.workers.actor_hybrid_worker.ActorHybridWorkerBase": {"sharding_manager"},
    "mindspeed_rl.workers.resharding.megatron_sharding_manager.MegatronShardingManager": {"vllm_weight_container"},
    "mindspeed_rl.models.rollout.vllm_engine.VLLMInferEngine": {"llm", "engine", "model", "hf_config"},
}


@pytest.mark.parametrize("cls_path", sorted(ATTRIBUTES))
def test_attributes_asp_reads_are_set(msrl_src, cls_path):
    have = _config_attrs(msrl_src, cls_path)
    missing = ATTRIBUTES[cls_path] - have
    assert not missing, f"{cls_path} never sets {missing}"
