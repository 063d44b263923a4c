"""A pure-HF group sampler for tests and small experiments with the reference trainer.

Why it exists: the trainer's unit tests and the demo task's learnability check need rollouts with the
behaviour log-probs of every sampled token, but starting vLLM costs seconds per test. This samples with
`transformers`' `generate` (KV cache, plain multinomial sampling at `temperature`, no top-k/top-p) and
returns the same `GroupResult`/`SampleResult` records the vLLM instances return. The real runs use vLLM.
"""
from __future__ import annotations

import time
from typing import Any, List, Optional, Sequence, Tuple

import torch


def _result_types():
    """D's record types (runtime/requests.py)."""
    from mindspeed_asp.runtime.requests import GroupResult, SampleResult

    return GroupResult, SampleResult


@torch.no_grad()
def sample_groups(model: Any, prompts: Sequence[Tuple[str, Sequence[int], int]], n: int, eos_token_id: int,
                  version: int = 0, temperature: float = 1.0, seed: Optional[int] = None,
                  pad_token_id: int = 0, group_id_prefix: str = "g") -> List[Any]:
    """Sample `n` responses per prompt; `prompts` are (prompt_id, prompt_token_ids, max_new_tokens).

    Each response stops at its first EOS (included in `token_ids`, as vLLM returns it) or at its prompt's
    max_new_tokens. `logprobs` are the sampling distribution's log-probs of the chosen tokens (logits /
    temperature), and every sample is tagged with policy `version` (min = max: one version per rollout).
    """
    from transformers import GenerationConfig

    GroupResult, SampleResult = _result_types()
    if n < 1:
        raise ValueError("n must be >= 1")
    if not prompts:
        return []
    device = next(model.parameters()).device
    rows = [(g, list(p[1]), int(p[2])) for g, p in enumerate(prompts) for _ in range(n)]
    width = max(len(r[1]) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for r, (_, toks, _) in enumerate(rows):
        ids[r, width - len(toks):] = torch.tensor(toks, dtype=torch.long)  # left padding for generation
        attn[r, width - len(toks):] = 1
    max_new = max(r[2] for r in rows)
    cfg = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=max_new,
                           eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token_id=None,
                           output_logits=True, return_dict_in_generate=True)
    if seed is not None:
        torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    t0 = time.time()
    out = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), generation_config=cfg)
    t1 = time.time()
    model.train(was_training)
    gen = out.sequences[:, width:].cpu()
    logits = torch.stack(out.logits, dim=1).float().cpu()  # [rows, steps, V]
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    per_group: List[List[Any]] = [[] for _ in prompts]
    for r, (g, _, cap) in enumerate(rows):
        toks = gen[r].tolist()
        hit = [k for k, t in enumerate(toks[:cap]) if t == eos_token_id]
        length = hit[0] + 1 if hit else min(cap, len(toks))
        chosen = gen[r, :length]
        lp = logp_all[r, torch.arange(length), chosen].tolist()
        per_group[g].append(SampleResult(token_ids=chosen.tolist(), logprobs=lp, min_version=version,
                                         max_version=version, finish_reason="stop" if hit else "length"))
    results = []
    for g, (pid, ptoks, _) in enumerate(prompts):
        results.append(GroupResult(group_id=f"{group_id_prefix}{g}", prompt_id=pid, instance=-1,
                                   samples=per_group[g], prompt_token_ids=list(ptoks), t_enqueued=t0,
                                   t_started=t0, t_finished=t1, stolen=False, minibatch=-1))
    return results
