"""MindSpeed-RL's real RuleReward actors on a real GRPOTransferDock (Ray CPU): under `guarantee_order`, stock
`compute_rm_score` crashes when one reward actor finishes its row range before another has fetched its own
(two nodes, rows ready at different times), and ASP's REWARD_PATCHES score every row exactly once with any
number of reward actors.

The verifier is MindSpeed-RL's own (`format`); its per-row metric, cumulated in the dock, counts how many
times each row was scored."""
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent
GBS, N, DISPATCH, NODES = 6, 2, 4, 2
ROWS = GBS * N


@pytest.fixture(scope="module")
def env(tmp_path_factory, msrl_src, no_ray_held):
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent))
    import msrl_shim
    msrl_shim.install()
    import ray
    from tiny_tokenizer import build_chatml_tokenizer
    from mindspeed_asp.runtime.ray_utils import actor_env
    tok_dir = build_chatml_tokenizer(tmp_path_factory.mktemp("tok") / "tok")
    env_vars = dict(actor_env())
    env_vars.update({"PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), str(msrl_src),
                                                    os.environ.get("PYTHONPATH", "")]),
                     "MINDSPEED_RL_SRC": str(msrl_src), "ASP_TEST_NODES": str(NODES)})
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=256 << 20, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": env_vars, "worker_process_setup_hook": "reward_shim.worker_setup"})
    yield {"ray": ray, "tok_dir": tok_dir}
    ray.shutdown()


def _dock(ray, tok_dir):
    """A GRPO dock holding GBS prompts (label = the group's index) and no responses yet."""
    import torch
    from transformers import AutoTokenizer
    from mindspeed_rl.trainer.utils import transfer_dock as td_mod
    from mindspeed_rl.utils.metrics import Metric
    tok = AutoTokenizer.from_pretrained(tok_dir)
    td = td_mod.GRPOTransferDock.options(num_cpus=0).remote(GBS, N, metrics=Metric(), max_age=1, GBS_train=GBS,
                                                            addition_columns=["labels"])
    batch = {"prompts": [torch.tensor(tok.encode(f"What is {g} + 30?")) for g in range(GBS)],
             "labels": [torch.tensor(tok.encode(str(g))) for g in range(GBS)]}
    batch_dict, indexes = td_mod.put_prompts_experience(batch, N, ["labels"])
    ray.get(td.put_experience.remote(batch_dict, indexes, is_prompt=True))
    return td, tok


def _respond(ray, td, tok, rows):
    import torch
    resp = [torch.tensor(tok.encode(f"<think> x </think><answer> {r} </answer>")) for r in rows]
    ray.get(td.put_experience.remote({"responses": resp, "response_length": [torch.tensor([len(x)]) for x in resp]},
                                     indexes=list(rows)))


def _actors(ray, tok_dir, count):
    from mindspeed_rl.workers.rule_reward import RuleReward
    megatron = SimpleNamespace(tokenizer_name_or_path=tok_dir, dataset_additional_keys=["labels"],
                               global_batch_size=GBS)
    rl = SimpleNamespace(n_samples_per_prompt=N, reward_dispatch_size=DISPATCH, guarantee_order=True,
                         multi_turn_enable=False, filter_groups_enable=False, verifier_function=["format"],
                         verifier_weight=[1.0], overlong_buffer_enable=False)
    actors = [RuleReward.options(num_cpus=0).remote() for _ in range(count)]
    ray.get([a.initialize.remote(megatron, rl, SimpleNamespace(pad=0, eod=1), False, dp_rank=i)
             for i, a in enumerate(actors)])
    return actors


def test_stock_rule_rewards_crash_when_ranges_finish_at_different_times(env):
    ray = env["ray"]
    td, tok = _dock(ray, env["tok_dir"])
    actors = _actors(ray, env["tok_dir"], NODES)  # one per node, as cli/train_grpo.py creates them
    ray.get([a.init_transfer_dock.remote(td) for a in actors])
    _respond(ray, td, tok, range(ROWS // NODES))  # node 0's range is generated first
    refs = [a.compute_rm_score.remote() for a in actors]
    with pytest.raises(ray.exceptions.RayTaskError, match="pop from empty list"):
        ray.get(refs[0], timeout=120)  # actor 0 done with its range while actor 1 still waits for its rows
    _respond(ray, td, tok, range(ROWS // NODES, ROWS))
    ray.get(refs[1], timeout=120)


@pytest.mark.parametrize("count", [2, 3])  # as many actors as nodes, and more
def test_patched_rule_rewards_score_every_row_exactly_once(env, count):
    ray = env["ray"]
    from mindspeed_asp.integrations.mindspeed_rl.data_patches import ExactlyOnceRuleReward, exactly_once_rule_rewards
    td, tok = _dock(ray, env["tok_dir"])
    rewards = exactly_once_rule_rewards(_actors(ray, env["tok_dir"], count) + ["model-reward-group"])
    assert all(isinstance(r, ExactlyOnceRuleReward) for r in rewards[:-1]) and rewards[-1] == "model-reward-group"
    rewards = rewards[:-1]
    for r in rewards:  # what RayGRPOTrainer.transfer_dock_init does with each reward_list entry
        assert not hasattr(r, "sync_init_transfer_dock")
        ray.get(r.init_transfer_dock.remote(td))
    _respond(ray, td, tok, range(ROWS // 2))
    refs = [r.compute_rm_score.remote() for r in rewards]  # what fit does
    time.sleep(1.0)
    _respond(ray, td, tok, range(ROWS // 2, ROWS))
    ray.get(refs, timeout=180)
    status = ray.get(td.get_consumer_status.remote())["rule_reward"]
    assert int(status.sum()) == ROWS
    assert int(ray.get(td.get_experience_status.remote())["rm_scores"].sum()) == ROWS  # every row has a score
    metrics = ray.get(td.get_metrics.remote()).metric
    assert len(metrics["format_rewards/mean"]) == ROWS  # scored once each: no row twice, none missed
