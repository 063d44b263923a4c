"""The reference GRPO trainer on a real tiny Qwen2 model (CPU): updates, weight export, checkpoints."""
import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs the runtime extra: pip install mindspeed-asp[runtime]")

from mindspeed_asp.runtime.tiny_model import ensure_tiny_model
from mindspeed_asp.runtime.trainer import GRPOTrainer
from mindspeed_asp.runtime.requests import GroupResult, SampleResult

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tied_model_path(tmp_path_factory):
    return ensure_tiny_model(str(tmp_path_factory.mktemp("tied") / "m"), seed=1, tie_word_embeddings=True)


PROMPT = [0, 400, 77, 91]
GOOD = [5, 6, 7, 1]
BAD = [300, 301, 302, 303, 304]


def make_group(trainer, responses, gid="g0", version=0, behaviour=None):
    samples = []
    for i, resp in enumerate(responses):
        lp = trainer.sequence_logprobs(PROMPT, resp).tolist() if behaviour is None else behaviour[i]
        samples.append(SampleResult(token_ids=list(resp), logprobs=lp, min_version=version,
                                    max_version=version, finish_reason="stop"))
    return GroupResult(group_id=gid, prompt_id="p0", instance=0, samples=samples, prompt_token_ids=list(PROMPT),
                       t_enqueued=0.0, t_started=0.0, t_finished=0.0)


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


def test_train_step_raises_logprob_of_rewarded_sample(tiny_model):
    tr = GRPOTrainer(tiny_model, lr=1e-2, seed=0)
    before_good = float(tr.sequence_logprobs(PROMPT, GOOD).sum())
    before_bad = float(tr.sequence_logprobs(PROMPT, BAD).sum())
    g = make_group(tr, [GOOD, BAD, GOOD, BAD])
    stats = tr.train_step([g], [[1.0, 0.0, 1.0, 0.0]])
    assert tr.version == 1 and stats["version"] == 1
    assert float(tr.sequence_logprobs(PROMPT, GOOD).sum()) > before_good + 0.1
    assert float(tr.sequence_logprobs(PROMPT, BAD).sum()) < before_bad - 0.1
    # On-policy data: the ratio is exactly 1, nothing is clipped, behaviour and current agree.
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert stats["clip_frac"] == 0.0
    assert abs(stats["mismatch_kl"]) < 1e-5
    assert stats["tokens"] == 2 * len(GOOD) + 2 * len(BAD)
    assert stats["tokens_total"] == stats["tokens"] + 4 * len(PROMPT)
    assert stats["grad_norm"] > 0 and stats["entropy"] > 0 and stats["reward_mean"] == 0.5
    for key in ("loss", "kl", "time", "bubble/padding_train"):
        assert key in stats


def test_constant_rewards_leave_the_policy_unchanged(tiny_model):
    tr = GRPOTrainer(tiny_model, lr=1e-2, seed=0)
    before = {k: v.clone() for k, v in tr.named_weights()}
    stats = tr.train_step([make_group(tr, [GOOD, BAD])], [[1.0, 1.0]])
    assert stats["grad_norm"] == 0.0
    for k, v in tr.named_weights():
        assert torch.equal(v, before[k]), k


def test_off_policy_samples_are_importance_weighted_and_clipped(tiny_model):
    tr = GRPOTrainer(tiny_model, lr=1e-3, seed=0, clip_eps=0.2)
    cur = tr.sequence_logprobs(PROMPT, GOOD)
    stale = (cur - 1.0).tolist()  # the behaviour policy gave these tokens e^-1 the current probability
    g = make_group(tr, [GOOD, BAD], behaviour=[stale, tr.sequence_logprobs(PROMPT, BAD).tolist()])
    stats = tr.train_step([g], [[1.0, 0.0]])
    assert stats["ratio_max"] == pytest.approx(float(torch.e), rel=1e-4)
    assert stats["clip_frac"] == pytest.approx(len(GOOD) / (len(GOOD) + len(BAD)))
    assert stats["mismatch_kl"] < 0  # behaviour log-probs below the current ones


def test_kl_zero_when_model_equals_reference(tiny_model):
    tr = GRPOTrainer(tiny_model, lr=1e-2, seed=0, kl_coef=0.1)
    s1 = tr.train_step([make_group(tr, [GOOD, BAD])], [[1.0, 0.0]])
    assert s1["kl"] == pytest.approx(0.0, abs=1e-7)
    s2 = tr.train_step([make_group(tr, [GOOD, BAD])], [[1.0, 0.0]])
    assert s2["kl"] > 1e-6
    assert s2["loss"] == pytest.approx(s2["pg_loss"] + 0.1 * s2["kl"], rel=1e-6)


def test_micro_batching_does_not_change_the_update(tiny_model):
    responses = [GOOD, BAD, [9] * 11, [12, 13], [1]]
    rewards = [[1.0, 0.0, 0.5, 0.2, 0.9]]
    whole = GRPOTrainer(tiny_model, lr=1e-2, seed=0)
    split = GRPOTrainer(tiny_model, lr=1e-2, seed=0, micro_batch_size=2)
    budget = GRPOTrainer(tiny_model, lr=1e-2, seed=0, micro_batch_tokens=10)
    grads = []
    for t in (whole, split, budget):  # compare the accumulated gradients the optimizer receives
        grads.append({})
        t.optimizer.step = lambda g=grads[-1], t=t: g.update(
            {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None})
    stats = [t.train_step([make_group(t, responses)], rewards) for t in (whole, split, budget)]
    assert [s["micro_batches"] for s in stats] == [1, 3, 5]
    assert len(grads[0]) == len(list(whole.model.parameters()))
    for g in grads[1:]:
        assert g.keys() == grads[0].keys()
        for k, v in g.items():
            assert torch.allclose(v, grads[0][k], atol=1e-7, rtol=1e-4), k
    assert stats[1]["grad_norm"] == pytest.approx(stats[0]["grad_norm"], rel=1e-5)
    # Padding bubble by hand: sequence lengths 5, 6, 8, 9, 15 (prompt 4 + response).
    assert stats[0]["bubble/padding_train"] == pytest.approx((5 * 15 - 43) / (5 * 15))
    # micro_batch_size=2 over the length-sorted rows: [5, 6], [8, 9], [15] -> 2 padded of 45 slots.
    assert stats[1]["bubble/padding_train"] == pytest.approx(2 / 45)
    assert stats[2]["bubble/padding_train"] == 0.0  # a budget of 10 tokens puts each row alone (15 > 10 still runs)


def test_named_weights_match_checkpoint_names_and_round_trip(tiny_model):
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    tr = GRPOTrainer(tiny_model, lr=1e-2, seed=0)
    tr.train_step([make_group(tr, [GOOD, BAD])], [[1.0, 0.0]])  # weights now differ from the file
    names = [n for n, _ in tr.named_weights()]
    with safe_open(str(Path(tiny_model) / "model.safetensors"), "pt") as f:
        assert sorted(names) == sorted(f.keys())  # the HF checkpoint names vLLM's load_weights accepts
    torch.manual_seed(123)
    fresh = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model))
    fresh.load_state_dict(dict(tr.named_weights()), strict=True)
    ids = PROMPT + GOOD
    assert torch.allclose(logits_of(fresh, ids), logits_of(tr.model, ids), atol=1e-6)
    assert not torch.allclose(logits_of(AutoModelForCausalLM.from_pretrained(tiny_model), ids),
                              logits_of(tr.model, ids), atol=1e-6)


def test_tied_embeddings_are_sent_once_under_the_input_name(tied_model_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    tr = GRPOTrainer(tied_model_path, lr=1e-2, seed=0)
    tr.train_step([make_group(tr, [GOOD, BAD])], [[1.0, 0.0]])
    weights = dict(tr.named_weights())
    assert "model.embed_tokens.weight" in weights and "lm_head.weight" not in weights
    assert len(weights) == len({id(p) for p in tr.model.parameters()})
    torch.manual_seed(7)
    fresh = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tied_model_path))
    missing, unexpected = fresh.load_state_dict(weights, strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}
    assert fresh.get_output_embeddings().weight.data_ptr() == fresh.get_input_embeddings().weight.data_ptr()
    ids = PROMPT + BAD
    assert torch.allclose(logits_of(fresh, ids), logits_of(tr.model, ids), atol=1e-6)


def test_checkpoint_resume_reproduces_the_next_update(tiny_model, tmp_path):
    a = GRPOTrainer(tiny_model, lr=1e-2, seed=0, kl_coef=0.05)
    a.train_step([make_group(a, [GOOD, BAD])], [[1.0, 0.0]])
    ckpt = a.save_checkpoint(tmp_path / "trainer.pt")
    g = make_group(a, [BAD, GOOD, [3, 4]])
    a.train_step([g], [[1.0, 0.0, 0.5]])

    b = GRPOTrainer(tiny_model, lr=1e-2, seed=0, kl_coef=0.05)
    b.load_checkpoint(ckpt)
    assert b.version == 1
    b.train_step([g], [[1.0, 0.0, 0.5]])  # same samples and behaviour log-probs as `a` saw
    assert b.version == a.version == 2
    wa = dict(a.named_weights())
    for k, v in b.named_weights():
        assert torch.allclose(v, wa[k], atol=1e-7), k
    # In-memory state round-trips too, and a foreign dict is refused.
    c = GRPOTrainer(tiny_model, lr=1e-2, seed=0)
    c.load_checkpoint(a.state_dict_for_checkpoint())
    assert c.version == 2 and c.weights_checksum() == pytest.approx(a.weights_checksum(), rel=1e-9)
    with pytest.raises(ValueError, match="checkpoint"):
        c.load_checkpoint({"format": "something else"})


def test_bad_input_is_refused_with_a_clear_message(tiny_model):
    tr = GRPOTrainer(tiny_model, lr=1e-2, seed=0)
    g = make_group(tr, [GOOD, BAD])
    with pytest.raises(ValueError, match="2 samples but 3 rewards"):
        tr.train_step([g], [[1.0, 0.0, 1.0]])
    with pytest.raises(ValueError, match="1 groups but 2 reward lists"):
        tr.train_step([g], [[1.0, 0.0], [0.0, 1.0]])
    g.samples[0].logprobs = g.samples[0].logprobs[:-1] + [float("nan")]
    with pytest.raises(ValueError, match="non-finite behaviour"):
        tr.train_step([g], [[1.0, 0.0]])
    g.samples[0].logprobs = g.samples[0].logprobs[:-1]
    with pytest.raises(ValueError, match="log-probs"):
        tr.train_step([g], [[1.0, 0.0]])
    g.samples[0].logprobs = None
    with pytest.raises(ValueError, match="no behaviour log-probs"):
        tr.train_step([g], [[1.0, 0.0]])
    assert tr.version == 0
    lenient = GRPOTrainer(tiny_model, lr=1e-2, seed=0, missing_logprobs="recompute")
    assert lenient.train_step([g], [[1.0, 0.0]])["ratio_mean"] == pytest.approx(1.0, abs=1e-5)


def test_save_pretrained_is_servable_hf_directory(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    tr = GRPOTrainer(tiny_model, lr=1e-2, seed=0)
    tr.train_step([make_group(tr, [GOOD, BAD])], [[0.0, 1.0]])
    out = tr.save_pretrained(tmp_path / "policy")
    assert json.loads((Path(out) / "config.json").read_text())["model_type"] == "qwen2"
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert torch.allclose(logits_of(reloaded, PROMPT), logits_of(tr.model, PROMPT), atol=1e-6)


def _accelerator():
    from mindspeed_asp.runtime.platform import current_platform

    return current_platform()


@pytest.mark.gpu
@pytest.mark.skipif(not _accelerator().is_accelerator, reason="needs a GPU/NPU (platform resolves to cpu)")
def test_train_step_on_the_platform_device_matches_cpu(tiny_model):
    dev = GRPOTrainer(tiny_model, lr=1e-2, seed=0)  # device from the platform object
    assert dev.device.type == _accelerator().device_type
    cpu = GRPOTrainer(tiny_model, lr=1e-2, seed=0, device="cpu")
    responses = [GOOD, BAD, [9] * 7]
    s_dev = dev.train_step([make_group(dev, responses)], [[1.0, 0.0, 0.5]])
    s_cpu = cpu.train_step([make_group(cpu, responses)], [[1.0, 0.0, 0.5]])
    assert s_dev["grad_norm"] == pytest.approx(s_cpu["grad_norm"], rel=1e-3)
    names = dict(dev.named_weights())
    assert all(t.device.type == dev.device.type for t in names.values())
    assert sorted(names) == sorted(n for n, _ in cpu.named_weights())
    assert float(dev.sequence_logprobs(PROMPT, GOOD).sum()) == pytest.approx(
        float(cpu.sequence_logprobs(PROMPT, GOOD).sum()), abs=1e-2)


def test_temperature_is_applied_to_the_recomputed_logprobs(tiny_model):
    t1 = GRPOTrainer(tiny_model, lr=1e-2, seed=0)
    t07 = GRPOTrainer(tiny_model, lr=1e-2, seed=0, temperature=0.7)
    with torch.no_grad():
        logits = t1.model(input_ids=torch.tensor([PROMPT + GOOD])).logits[0, len(PROMPT) - 1:-1]
    expected = torch.log_softmax(logits / 0.7, -1).gather(-1, torch.tensor(GOOD)[:, None])[:, 0]
    assert torch.allclose(t07.sequence_logprobs(PROMPT, GOOD), expected, atol=1e-6)
    assert not torch.allclose(t1.sequence_logprobs(PROMPT, GOOD), expected, atol=1e-3)
    with pytest.raises(ValueError, match="temperature"):
        GRPOTrainer(tiny_model, temperature=0.0)


@pytest.mark.slow
def test_vllm_behaviour_logprobs_match_the_trainer(tiny_model, monkeypatch):
    """The contract with the real engine: vLLM's sampled-token log-probs (processed, at temperature 0.7)
    equal the trainer's recomputed ones, and a stopped sample ends with the EOS id, so on-policy data
    trains with ratio 1 and the EOS token is learned."""
    import gc

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams

    llm = LLM(tiny_model, skip_tokenizer_init=True, enforce_eager=True, dtype="float32", max_model_len=256,
              kv_cache_memory_bytes=32 * 2**20, logprobs_mode="processed_logprobs", seed=0)
    try:
        params = SamplingParams(n=64, max_tokens=40, temperature=0.7, logprobs=0, stop_token_ids=[1], seed=0)
        outs = llm.generate([{"prompt_token_ids": PROMPT}], params)[0].outputs
    finally:
        del llm
        gc.collect()
    tr = GRPOTrainer(tiny_model, lr=1e-3, seed=0, temperature=0.7)
    samples = []
    for c in outs:
        lps = [float(entry[tok].logprob) for tok, entry in zip(c.token_ids, c.logprobs)]
        mine = tr.sequence_logprobs(PROMPT, list(c.token_ids))
        assert torch.allclose(mine, torch.tensor(lps), atol=2e-3), (c.token_ids, lps, mine.tolist())
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == 1
        samples.append(SampleResult(token_ids=list(c.token_ids), logprobs=lps, min_version=0, max_version=0,
                                    finish_reason=c.finish_reason))
    group = GroupResult(group_id="v", prompt_id="p0", instance=0, samples=samples, prompt_token_ids=PROMPT,
                        t_enqueued=0.0, t_started=0.0, t_finished=0.0)
    stats = tr.train_step([group], [[float(i % 2) for i in range(len(samples))]])
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-3) and abs(stats["mismatch_kl"]) < 1e-3


# ---------------------------------------------------------------------------- the decoupled objective
def _grads_after(tr, groups, rewards):
    """Run one train_step, capturing the accumulated gradients instead of stepping the optimizer."""
    grads = {}
    tr.optimizer.step = lambda: grads.update(
        {n: p.grad.clone() for n, p in tr.model.named_parameters() if p.grad is not None})
    return tr.train_step(groups, rewards), grads


def test_decoupled_equals_standard_on_lag_zero_data(tiny_model):
    responses, rewards = [GOOD, BAD, [9] * 6], [[1.0, 0.0, 0.4]]
    std = GRPOTrainer(tiny_model, lr=1e-2, seed=0, micro_batch_size=2)
    dec = GRPOTrainer(tiny_model, lr=1e-2, seed=0, micro_batch_size=2, objective="decoupled")
    s_std, g_std = _grads_after(std, [make_group(std, responses)], rewards)
    s_dec, g_dec = _grads_after(dec, [make_group(dec, responses)], rewards)
    # Lag 0: the behaviour policy is the proximal one by definition, so every weight is exactly 1.
    assert s_dec["offpolicy/iw_mean"] == 1.0 and s_dec["offpolicy/iw_max"] == 1.0
    assert s_dec["offpolicy/iw_frac_capped"] == 0.0 and s_dec["offpolicy/behav_prox_absdiff_max"] == 0.0
    assert s_dec["offpolicy/iw_mean_lag0"] == 1.0 and s_dec["lag/token_weighted_mean"] == 0.0
    assert s_dec["ratio_mean"] == 1.0 and s_dec["clip_frac"] == 0.0
    assert s_dec["loss"] == pytest.approx(s_std["loss"], abs=1e-7)
    assert g_dec.keys() == g_std.keys()
    for k, v in g_dec.items():
        assert torch.allclose(v, g_std[k], atol=1e-7, rtol=1e-5), k
    # The same holds when the engine's numbers for a lag-0 sample are off: they are not used as behaviour.
    tr = GRPOTrainer(tiny_model, lr=1e-2, seed=0, objective="decoupled")
    off = [(tr.sequence_logprobs(PROMPT, r) - 0.7).tolist() for r in (GOOD, BAD)]
    s = tr.train_step([make_group(tr, [GOOD, BAD], behaviour=off)], [[1.0, 0.0]])
    assert s["offpolicy/iw_mean"] == 1.0 and s["mismatch_kl"] == pytest.approx(-0.7, abs=1e-5)


def test_decoupled_weights_stale_samples_by_hand(tiny_model):
    tr = GRPOTrainer(tiny_model, lr=1e-2, seed=0, objective="decoupled", iw_cap=2.0)
    tr.train_step([make_group(tr, [GOOD, BAD])], [[1.0, 0.0]])  # now at version 1
    cur_good, cur_bad = tr.sequence_logprobs(PROMPT, GOOD), tr.sequence_logprobs(PROMPT, BAD)
    # Generated by version 0 (lag 1). GOOD: the sampler gave its tokens e^-1 of the current probability, so
    # pi_prox / pi_behav = e > cap -> 2.0. BAD: the sampler agreed with the trainer -> 1.0.
    g = make_group(tr, [GOOD, BAD], version=0, behaviour=[(cur_good - 1.0).tolist(), cur_bad.tolist()])
    stats = tr.train_step([g], [[1.0, 0.0]])
    n = len(GOOD) + len(BAD)
    assert stats["offpolicy/iw_max"] == pytest.approx(2.0)
    assert stats["offpolicy/iw_frac_capped"] == pytest.approx(len(GOOD) / n)
    assert stats["offpolicy/iw_mean"] == pytest.approx((2.0 * len(GOOD) + len(BAD)) / n, rel=1e-5)
    assert stats["offpolicy/iw_mean_lag1"] == pytest.approx(stats["offpolicy/iw_mean"])
    assert stats["offpolicy/behav_prox_absdiff_max"] == pytest.approx(1.0, abs=1e-4)
    assert stats["lag/token_weighted_mean"] == 1.0
    # The ratio is taken against the proximal policy (= this update's starting weights): 1, never clipped.
    assert stats["clip_frac"] == 0.0 and stats["offpolicy/clip_frac"] == 0.0
    # pg_loss = sum_t w_t * (-A_i) / n with A = +-0.5 / (sqrt(0.5) + 1e-6).
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert stats["pg_loss"] == pytest.approx(-(2.0 * a * len(GOOD) - a * len(BAD)) / n, rel=1e-5)


def test_decoupled_uses_token_versions_and_sequence_mode(tiny_model):
    tr = GRPOTrainer(tiny_model, lr=1e-2, seed=0, objective="decoupled", iw_cap=5.0)
    tr.version = 1
    cur = tr.sequence_logprobs(PROMPT, GOOD)
    g = make_group(tr, [GOOD, BAD], version=0, behaviour=[(cur - 0.25).tolist(),
                                                          tr.sequence_logprobs(PROMPT, BAD).tolist()])
    g.samples[0].token_versions = [0, 0, 1, 1]  # a weight update landed after the second token
    g.samples[0].max_version = 1
    g.samples[1].token_versions = [0] * len(BAD)
    s = tr.train_step([g], [[1.0, 0.0]])
    n = len(GOOD) + len(BAD)
    w = math.exp(0.25)
    assert s["offpolicy/iw_mean"] == pytest.approx((2 * w + 2 + len(BAD)) / n, rel=1e-5)
    seq = GRPOTrainer(tiny_model, lr=1e-2, seed=0, objective="decoupled", iw_cap=5.0, iw_mode="sequence")
    seq.version = 1
    g2 = make_group(seq, [GOOD, BAD], version=0, behaviour=[(cur - 0.25).tolist(),
                                                            seq.sequence_logprobs(PROMPT, BAD).tolist()])
    s2 = seq.train_step([g2], [[1.0, 0.0]])  # one weight per sequence: e^(4 * 0.25) for GOOD
    assert s2["offpolicy/iw_max"] == pytest.approx(math.e, rel=1e-4)
    assert s2["offpolicy/iw_mean"] == pytest.approx((math.e * len(GOOD) + len(BAD)) / n, rel=1e-4)


def test_standard_objective_logs_the_weights_it_does_not_apply(tiny_model):
    tr = GRPOTrainer(tiny_model, lr=1e-3, seed=0)
    tr.version = 2
    cur = tr.sequence_logprobs(PROMPT, GOOD)
    g = make_group(tr, [GOOD, BAD], version=1, behaviour=[(cur - 1.0).tolist(),
                                                          tr.sequence_logprobs(PROMPT, BAD).tolist()])
    s = tr.train_step([g], [[1.0, 0.0]])
    assert s["clip_frac"] == pytest.approx(len(GOOD) / (len(GOOD) + len(BAD)))  # clipped against behaviour
    assert s["offpolicy/clip_frac"] == s["clip_frac"]
    assert s["offpolicy/iw_max"] == pytest.approx(2.0) and s["offpolicy/iw_mean_lag1"] > 1.0


def test_objective_settings_are_validated(tiny_model):
    for kwargs, match in (({"objective": "ppo"}, "objective"), ({"iw_cap": 0.9}, "iw_cap"),
                          ({"iw_mode": "row"}, "iw_mode")):
        with pytest.raises(ValueError, match=match):
            GRPOTrainer(tiny_model, **kwargs)
