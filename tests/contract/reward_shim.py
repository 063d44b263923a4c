"""Ray worker set-up for the rule-reward contract test (test-only).

MindSpeed-RL importable on CPU (msrl_shim), and `mindspeed_rl.utils.utils.get_node_nums` answering
ASP_TEST_NODES when set, so a one-node local Ray cluster stands in for a multi-node one: RuleReward's
`compute_rm_score` is shipped by value but looks its helpers up by module reference in the actor process.
"""
import os


def worker_setup() -> None:
    import msrl_shim
    msrl_shim.install()
    nodes = os.environ.get("ASP_TEST_NODES")
    if nodes:
        from mindspeed_rl.utils import utils
        utils.get_node_nums = lambda: int(nodes)
