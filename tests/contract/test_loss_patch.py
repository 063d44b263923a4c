"""The decoupled-objective patch on MindSpeed-RL's real GRPO actor loss (pinned source, CPU).

The loss runs MindSpeed-RL's own log-prob path (`StandardLogProbComputer`: cross-entropy through the vocab-
parallel hook, the context-parallel all-gather, the prompt truncation), with a one-rank gloo group and a CPU
cross-entropy standing in for Megatron's vocab-parallel one. Patches go through this project's PatchRegistry.
"""
import ast
import math
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import msrl_shim  # noqa: E402

from mindspeed_asp.integrations.mindspeed_rl import loss_patch  # noqa: E402
from mindspeed_asp.integrations.mindspeed_rl.data_patches import POLICY_VERSION, ROLLOUT_LOG_PROB  # noqa: E402
from mindspeed_asp.integrations.mindspeed_rl.patch_registry import PatchRegistry  # noqa: E402

LOSS_TARGET = "mindspeed_rl.models.loss.grpo_actor_loss_func.GRPOActorLossFunc.compute_loss"
DISPATCH_TARGET = "mindspeed_rl.workers.base_worker.BaseWorker.dispatch_transfer_dock_data"
PAD_ID = 151643.0  # what MindSpeed-RL's unpack_pad_experience writes after a row's end (the pad token id)
V = 17
# base_worker imports vLLM-Ascend, so on CPU only the loss target is applied; the dispatch wrapper is tested
# directly and its signature is read from the source.
LOSS_ONLY = [(t, w) for t, w in loss_patch.LOSS_PATCHES if t == LOSS_TARGET]


class _OneRank:
    """The parallel-state calls the log-prob path makes, for a single rank (no TP, no CP)."""

    def get_context_parallel_world_size(self):
        return 1

    def get_context_parallel_group(self):
        return None

    def get_context_parallel_rank(self):
        return 0


def _cpu_cross_entropy(vocab_parallel_logits, target):
    logp = torch.log_softmax(vocab_parallel_logits.float(), dim=-1)
    return -logp.gather(-1, target.long().unsqueeze(-1)).squeeze(-1)


@pytest.fixture(scope="module")
def msrl(tmp_path_factory):
    msrl_shim.install()
    import torch.distributed as dist
    from mindspeed_rl.models.loss import grpo_actor_loss_func
    from mindspeed_rl.utils import compute

    created = False
    if not dist.is_initialized():
        init = tmp_path_factory.mktemp("gloo") / "init"
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
        created = True
    saved = compute.get_parallel_state(), compute.get_vocab_parallel()
    compute.set_parallel_state(_OneRank())
    compute.set_vocab_parallel(_cpu_cross_entropy)
    try:
        yield grpo_actor_loss_func
    finally:
        compute.set_parallel_state(saved[0])
        compute.set_vocab_parallel(saved[1])
        if created:
            dist.destroy_process_group()


@pytest.fixture(autouse=True)
def npu_is_identity(monkeypatch):
    """MindSpeed-RL moves the response mask with `.npu()`; on CPU that is the identity. No run config in the
    environment (default settings), no trainer version."""
    from mindspeed_asp.integrations.mindspeed_rl.config_section import CONFIG_ENV

    monkeypatch.setattr(torch.Tensor, "npu", lambda self, *a, **k: self, raising=False)
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    loss_patch.clear_settings_cache()
    loss_patch.set_trainer_version(None)
    yield
    loss_patch.set_trainer_version(None)
    loss_patch.clear_settings_cache()


ACTIVE = loss_patch.LossSettings(True, "decoupled", 2.0, "token")


@pytest.fixture()
def active(monkeypatch):
    """ASP's asynchronous pool is active (mode asp/async, max_lag >= 1, decoupled): the patches act."""
    monkeypatch.setattr(loss_patch, "asp_settings", lambda: ACTIVE)
    return ACTIVE


def make_loss(msrl, kl=0.05):
    fn = msrl.GRPOActorLossFunc()
    fn.add_loss_meta_info({"clip_ratio": 0.2, "kl_ctrl": types.SimpleNamespace(value=kl), "entropy_coeff": 0.0,
                           "kl_penalty": "low_var_kl"})
    return fn


def make_batch(seed=0):
    """Three rows in MindSpeed-RL's layout (prompt + response, right-padded) and logits for them."""
    g = torch.Generator().manual_seed(seed)
    prompts, resp_lens = [3, 2, 4], [4, 2, 3]
    R, L = max(resp_lens), max(p + r for p, r in zip(prompts, resp_lens))
    input_ids = torch.zeros(3, L, dtype=torch.long)
    responses = torch.zeros(3, R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, resp_lens)):
        row = torch.randint(1, V, (p + r,), generator=g)
        input_ids[i, :p + r] = row
        responses[i, :r] = row[p:]
    labels = torch.cat([input_ids[:, 1:], torch.zeros(3, 1, dtype=torch.long)], dim=1)
    logits = torch.randn(3, L, V, generator=g)
    mask = torch.zeros(3, R, dtype=torch.bool)
    for i, r in enumerate(resp_lens):
        mask[i, :r] = True
    # The current log-probs of the response tokens, to build old/ref log-probs around them.
    lp = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    cur = torch.zeros(3, R)
    for i, (p, r) in enumerate(zip(prompts, resp_lens)):
        cur[i, :r] = lp[i, p - 1:p - 1 + r]
    old = torch.where(mask, cur + 0.3 * torch.randn(3, R, generator=g), torch.full((3, R), PAD_ID))
    ref = torch.where(mask, cur + 0.1 * torch.randn(3, R, generator=g), torch.full((3, R), PAD_ID))
    batch = {"input_ids": input_ids, "labels": labels, "responses": responses,
             "prompt_length": torch.tensor(prompts).view(-1, 1), "response_length": torch.tensor(resp_lens).view(-1, 1),
             "advantages": torch.randn(3, 1, generator=g).expand(3, R).clone(),
             "old_log_prob": old, "ref_log_prob": ref}
    return batch, logits, mask


def run_loss(fn, batch, logits):
    out = logits.clone().requires_grad_(True)
    loss, stats = fn.compute_loss(out, dict(batch))
    loss.backward()
    return loss.detach(), stats, out.grad


def patched(registry_targets):
    reg = PatchRegistry()
    for target, wrapper in registry_targets:
        reg.register_patch(target, wrapper)
    reg.apply_patches()
    return reg


def test_stock_batch_is_bit_identical(msrl):
    batch, logits, _ = make_batch()
    fn = make_loss(msrl)
    orig_fn = msrl.GRPOActorLossFunc.compute_loss
    ref_loss, ref_stats, ref_grad = run_loss(fn, batch, logits)
    ref_lp = fn.compute_loss(logits, dict(batch), forward_only=True)
    reg = patched([(LOSS_TARGET, loss_patch.compute_loss_wrapper)])
    try:
        assert msrl.GRPOActorLossFunc.compute_loss.__wrapped__ is orig_fn
        loss, stats, grad = run_loss(fn, batch, logits)
        assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad) and stats == ref_stats
        assert not any(k.startswith("asp/") for k in stats)
        # forward_only (the old-log-prob pass) returns the original's log-probs even with the column present.
        with_col = dict(batch, **{ROLLOUT_LOG_PROB: batch["old_log_prob"] - 1.0})
        assert torch.equal(fn.compute_loss(logits, with_col, forward_only=True), ref_lp)
    finally:
        reg.remove_patches()
    assert msrl.GRPOActorLossFunc.compute_loss is orig_fn


def test_behaviour_equal_to_old_gives_the_original_loss(msrl, active):
    batch, logits, mask = make_batch(1)
    fn = make_loss(msrl)
    ref_loss, ref_stats, ref_grad = run_loss(fn, batch, logits)
    assert ref_stats["actor/pg_clipfrac"] > 0  # the clip is exercised
    reg = patched(LOSS_ONLY)
    try:
        same = dict(batch, **{ROLLOUT_LOG_PROB: batch["old_log_prob"].clone()})  # pad id after each row's end
        loss, stats, grad = run_loss(fn, same, logits)
    finally:
        reg.remove_patches()
    # Every weight is exactly 1.0 and the rest is MindSpeed-RL's arithmetic: equal bit for bit (1e-6 is the
    # contract; the assertion is the stronger one, which holds on CPU).
    assert float(loss) == pytest.approx(float(ref_loss), abs=1e-6) and torch.equal(loss, ref_loss)
    assert torch.equal(grad, ref_grad)
    for k, v in ref_stats.items():
        assert stats[k] == pytest.approx(v, abs=1e-6), k
    assert stats["asp/iw_mean"] == 1.0 and stats["asp/iw_max"] == 1.0
    assert stats["asp/iw_frac_capped"] == 0.0 and stats["asp/behav_prox_absdiff_max"] == 0.0
    assert stats["asp/clip_frac"] == pytest.approx(ref_stats["actor/pg_clipfrac"])
    assert stats["asp/behav_unreported_frac"] == 0.0  # the pad ids sit outside the response mask


def test_stale_behaviour_is_weighted_and_capped(msrl, active):
    batch, logits, mask = make_batch(2)
    fn = make_loss(msrl, kl=0.0)
    ref_loss, _, ref_grad = run_loss(fn, batch, logits)
    n = int(mask.sum())
    reg = patched(LOSS_ONLY)
    try:
        # Stale by a lot: the sampler gave every token e^-1.5 of the proximal probability -> w = e^1.5 > 2.
        stale = dict(batch, **{ROLLOUT_LOG_PROB: torch.where(mask, batch["old_log_prob"] - 1.5, batch["old_log_prob"])})
        loss, stats, grad = run_loss(fn, stale, logits)
        assert stats["asp/iw_frac_capped"] == 1.0 and stats["asp/iw_mean"] == pytest.approx(2.0)
        assert stats["asp/behav_prox_absdiff_mean"] == pytest.approx(1.5, rel=1e-5)
        assert float(loss) == pytest.approx(2.0 * float(ref_loss), rel=1e-5)  # uniform weight, no KL
        assert torch.allclose(grad, 2.0 * ref_grad, atol=1e-6)  # the weight scales, never differentiates
        # Slightly stale the other way: w = e^-0.1 everywhere, nothing capped.
        mild = dict(batch, **{ROLLOUT_LOG_PROB: torch.where(mask, batch["old_log_prob"] + 0.1, batch["old_log_prob"])})
        loss2, stats2, _ = run_loss(fn, mild, logits)
        assert stats2["asp/iw_frac_capped"] == 0.0
        assert stats2["asp/iw_mean"] == pytest.approx(math.exp(-0.1), rel=1e-5)
        assert float(loss2) != pytest.approx(float(ref_loss), rel=1e-3)
        # Per lag, with the trainer version known: row 0 is lag 0 (its weight is exactly 1 whatever vLLM said).
        loss_patch.set_trainer_version(5)
        lagged = dict(stale, **{POLICY_VERSION: torch.tensor([[5], [4], [3]])})
        _, stats3, _ = run_loss(fn, lagged, logits)
        assert stats3["asp/iw_mean_lag0"] == 1.0
        assert stats3["asp/iw_mean_lag1"] == pytest.approx(2.0) and stats3["asp/iw_mean_lag2"] == pytest.approx(2.0)
        loss_patch.set_trainer_version(None)
        _, stats4, _ = run_loss(fn, lagged, logits)
        assert not any("lag" in k for k in stats4)
        # An unreported token (NaN) counts as proximal: weight 1, and it is counted.
        nan = stale[ROLLOUT_LOG_PROB].clone()
        nan[0, 0] = float("nan")
        _, stats5, grad5 = run_loss(fn, dict(batch, **{ROLLOUT_LOG_PROB: nan}), logits)
        assert stats5["asp/behav_unreported_frac"] == pytest.approx(1 / n)
        assert stats5["asp/iw_mean"] == pytest.approx((2.0 * (n - 1) + 1.0) / n)
        assert torch.isfinite(grad5).all()
    finally:
        reg.remove_patches()


def test_gradients_reach_the_logits_of_response_tokens_only(msrl, active):
    batch, logits, mask = make_batch(3)
    fn = make_loss(msrl)
    reg = patched(LOSS_ONLY)
    try:
        stale = dict(batch, **{ROLLOUT_LOG_PROB: batch["old_log_prob"][:, :2] - 0.4})  # narrower: NaN-padded
        loss, stats, grad = run_loss(fn, stale, logits)
    finally:
        reg.remove_patches()
    assert torch.isfinite(loss) and grad is not None and torch.isfinite(grad).all()
    per_pos = grad.abs().sum(-1)
    prompts, resp = batch["prompt_length"].view(-1).tolist(), batch["response_length"].view(-1).tolist()
    for i, (p, r) in enumerate(zip(prompts, resp)):
        assert (per_pos[i, p - 1:p - 1 + r] > 0).all(), i  # positions that predict response tokens
        assert float(per_pos[i, :p - 1].sum()) == 0.0 and float(per_pos[i, p - 1 + r:].sum()) == 0.0
    assert stats["asp/behav_unreported_frac"] > 0  # the columns past the narrower behaviour tensor


def _vendored_signature(src: Path, dotted: str):
    """(argument names, default expressions, *args?, **kwargs?) of a method, read from the pinned source."""
    parts = dotted.split(".")
    node = ast.parse(src.joinpath(*parts[:-2]).with_suffix(".py").read_text())
    cls = next(n for n in node.body if isinstance(n, ast.ClassDef) and n.name == parts[-2])
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == parts[-1])
    a = fn.args
    return [x.arg for x in a.args], [ast.unparse(d) for d in a.defaults], a.vararg is not None, a.kwarg is not None


def test_wrappers_keep_the_vendored_signatures(msrl_src):
    import inspect
    assert [t for t, _ in loss_patch.LOSS_PATCHES] == [DISPATCH_TARGET, LOSS_TARGET]
    for target, wrapper in loss_patch.LOSS_PATCHES:
        assert wrapper.__name__.endswith("wrapper"), target  # stacked around the original, not a replacement
        sig = inspect.signature(wrapper(lambda *a, **k: None), follow_wrapped=False)
        params = list(sig.parameters.values())
        named = [p for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
        mine = ([p.name for p in named], [repr(p.default) for p in named if p.default is not p.empty],
                any(p.kind == p.VAR_POSITIONAL for p in params), any(p.kind == p.VAR_KEYWORD for p in params))
        assert mine == _vendored_signature(Path(msrl_src), target), target


def _recording_dispatch():
    calls = []

    def orig(self, stage, columns, count, tp_size=1, cp_size=1, cp_algo=None, use_vllm=False, indexes=None,
             get_n_samples=True, enable_partial_rollout=False, is_generate=False):
        calls.append((stage, columns, count, tp_size, cp_size, cp_algo, use_vllm, indexes, get_n_samples,
                      enable_partial_rollout, is_generate))
        return {}, []
    return orig, calls


def _update_requests(msrl_src):
    """The column lists ActorHybridWorkerBase.update asks for at the pinned commit (GRPO, DAPO, each with and
    without old_log_prob), read from its source: the lists ASP must extend."""
    fn = _find_method(Path(msrl_src), "mindspeed_rl.workers.actor_hybrid_worker.ActorHybridWorkerBase.update")
    lists = [ast.literal_eval(n.value) for n in ast.walk(fn) if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "experience_columns" for t in n.targets)
             and isinstance(n.value, ast.List)]
    assert len(lists) == 2, lists  # ray_dapo and the rest
    text = ast.unparse(fn)
    assert "experience_consumer_stage = 'actor_train'" in text and "experience_columns.remove('old_log_prob')" in text
    return lists + [[c for c in cols if c != "old_log_prob"] for cols in lists]


def _find_method(src: Path, dotted: str):
    parts = dotted.split(".")
    node = ast.parse(src.joinpath(*parts[:-2]).with_suffix(".py").read_text())
    cls = next(n for n in node.body if isinstance(n, ast.ClassDef) and n.name == parts[-2])
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == parts[-1])


def test_dispatch_adds_the_columns_to_the_update_request_only(monkeypatch, msrl_src):
    """Per call: the actor update's own request gains ASP's two columns; every other `actor_train` dispatch
    (the peer's unit test asks for none and pins the broadcast count) and every other stage is untouched."""
    orig, calls = _recording_dispatch()
    wrapped = loss_patch.dispatch_transfer_dock_data_wrapper(orig)
    assert wrapped.__wrapped__ is orig
    monkeypatch.setattr(loss_patch, "asp_settings", lambda: ACTIVE)
    for cols in _update_requests(msrl_src):
        asked = list(cols)
        wrapped(None, "actor_train", asked, 8, 2, 1, None, indexes=[1, 2], get_n_samples=False)
        assert calls[-1] == ("actor_train", cols + [ROLLOUT_LOG_PROB, POLICY_VERSION], 8, 2, 1, None, False,
                             [1, 2], False, False, False), cols
        assert asked == cols  # the caller's list is not mutated
    for stage, cols in (("actor_train", []), ("actor_train", ["input_ids"]), ("actor_train", ["responses"]),
                        ("actor_log_prob", ["responses", "advantages", "input_ids"]),
                        ("actor_rollout", ["prompts", "prompt_length"])):
        wrapped(None, stage, cols, 8)
        assert calls[-1][0] == stage and calls[-1][1] is cols, (stage, cols)
    update = _update_requests(msrl_src)[0]
    monkeypatch.setattr(loss_patch, "asp_settings", lambda: ACTIVE._replace(active=False))
    wrapped(None, "actor_train", update, 8)
    assert calls[-1][1] is update


@pytest.mark.parametrize("mode", ["no config", "stock", "colocated", "objective standard"])
def test_inactive_settings_give_the_stock_loss_even_with_the_column(msrl, monkeypatch, tmp_path, mode):
    """Without an active pool the wrapper is stock bit for bit, also for a micro-batch that carries
    `rollout_log_prob` (the patched DataStrategy gives the dock that column in every mode)."""
    import yaml

    from mindspeed_asp.integrations.mindspeed_rl.config_section import CONFIG_ENV
    if mode != "no config":
        data = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "qwen25_7b_A3_asp.yaml").read_text())
        data["asp"].update({"stock": {"mode": "stock", "max_lag": 0}, "colocated": {"mode": "colocated", "max_lag": 0},
                            "objective standard": {"mode": "asp", "max_lag": 1, "objective": "standard"}}[mode])
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump(data))
        monkeypatch.setenv(CONFIG_ENV, str(path))
    loss_patch.clear_settings_cache()
    try:
        assert not loss_patch.asp_settings().active
    except Exception as exc:  # noqa: BLE001 - a schema without `objective` refuses it, naming it
        assert mode == "objective standard" and "objective" in str(exc)
        return
    batch, logits, _ = make_batch(5)
    fn = make_loss(msrl)
    stale = dict(batch, **{ROLLOUT_LOG_PROB: batch["old_log_prob"] - 1.5})
    ref_loss, ref_stats, ref_grad = run_loss(fn, stale, logits)  # unpatched: the column is ignored
    reg = patched(LOSS_ONLY)
    try:
        loss, stats, grad = run_loss(fn, stale, logits)
    finally:
        reg.remove_patches()
    assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad) and stats == ref_stats
    assert not any(k.startswith("asp/") for k in stats)


def test_settings_come_from_the_runs_asp_section(monkeypatch, tmp_path, msrl):
    import yaml

    from mindspeed_asp.integrations.mindspeed_rl.config_section import CONFIG_ENV

    configs = Path(__file__).resolve().parents[2] / "configs"
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    loss_patch.clear_settings_cache()
    try:
        assert loss_patch.asp_settings() == (False, "decoupled", 2.0, "token")
        data = yaml.safe_load((configs / "qwen25_7b_A3_asp.yaml").read_text())
        for mode, max_lag, active in (("stock", 0, False), ("colocated", 0, False), ("asp", 0, True), ("asp", 1, True),
                                      ("async", 2, True)):
            data["asp"].update(mode=mode, max_lag=max_lag)
            path = tmp_path / f"{mode}{max_lag}.yaml"
            path.write_text(yaml.safe_dump(data))
            monkeypatch.setenv(CONFIG_ENV, str(path))
            loss_patch.clear_settings_cache()
            got = loss_patch.asp_settings()
            assert got.active is active and got.iw_mode in ("token", "sequence") and got.iw_cap >= 1.0, mode
        # `objective: standard` (where the config schema knows the key) turns both patches off: stock loss.
        data["asp"]["objective"] = "standard"
        path = tmp_path / "standard.yaml"
        path.write_text(yaml.safe_dump(data))
        monkeypatch.setenv(CONFIG_ENV, str(path))
        loss_patch.clear_settings_cache()
        try:
            got = loss_patch.asp_settings()
        except Exception as exc:  # noqa: BLE001 - a schema without the key refuses it, naming it
            assert "objective" in str(exc)
            return
        assert got.objective == "standard" and not got.active
        batch, logits, _ = make_batch(4)
        fn = make_loss(msrl)
        ref = run_loss(fn, batch, logits)
        reg = patched(LOSS_ONLY)
        try:
            out = run_loss(fn, dict(batch, **{ROLLOUT_LOG_PROB: batch["old_log_prob"] - 1.0}), logits)
        finally:
            reg.remove_patches()
        assert torch.equal(out[0], ref[0]) and out[1] == ref[1]
    finally:
        loss_patch.clear_settings_cache()
