"""Prompt tokens: stock MindSpeed-RL's vLLM engine decodes each prompt with skip_special_tokens=True and lets
vLLM tokenise the text again (vllm_engine.py, generate_sequences); ASP's rollout pool sends the
TransferDock's prompt ids as `prompt_token_ids`.

Decision (docs/ascend.md): ASP keeps the ids. They are the context the trainer scores (stock's too), so the
behaviour log-probs ASP stores (`rollout_log_prob`, the decoupled objective's denominator) are taken under
the same context as the loss. This test pins down what that means, on prompts rendered with MindSpeed-RL's
own templates (configs/model/templates.json) and a Qwen-like tokenizer built offline: identical ids for
templates without special tokens (`empty`, math_17k's), different ids for ChatML templates (`qwen_r1`,
deepscaler's; `qwen3`), where stock's vLLM never sees `<|im_start|>`/`<|im_end|>`."""
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
QUESTION = "What is 12 + 30? Let x = 3, then 2x + 1 = 7."


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    sys.path.insert(0, str(HERE.parent))
    from tiny_tokenizer import build_chatml_tokenizer
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(build_chatml_tokenizer(tmp_path_factory.mktemp("tok") / "tok"))


def _render(msrl_src, name):
    templates = {t["name"]: t for t in json.loads((msrl_src / "configs" / "model" / "templates.json").read_text())}
    t = templates[name]
    text = ""
    if t.get("default_system") and "format_system" in t:
        text += t["format_system"]["slots"][0].replace("{{content}}", t["default_system"])
    return text + t["format_user"]["slots"][0].replace("{{content}}", QUESTION)


def _stock_vllm_ids(tok, ids):
    """vllm_engine.py: decode(p, skip_special_tokens=True), then vLLM's text prompt path (`encode`; Qwen's
    tokenizers add no BOS)."""
    return tok.encode(tok.decode(ids, skip_special_tokens=True))


def test_templates_without_special_tokens_reach_vllm_identically(msrl_src, tok):
    ids = tok.encode(_render(msrl_src, "empty"))
    assert _stock_vllm_ids(tok, ids) == ids  # ASP's token ids are what stock generates from


@pytest.mark.parametrize("name", ["qwen_r1", "qwen3"])
def test_chatml_templates_differ_stock_drops_the_role_markers(msrl_src, tok, name):
    text = _render(msrl_src, name)
    ids = tok.encode(text)  # what the dataset stores, the TransferDock holds and the trainer scores
    special = {tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")}
    assert special <= set(ids)
    stock = _stock_vllm_ids(tok, ids)
    assert stock != ids and not special & set(stock)  # stock generates from a different context
    assert tok.decode(stock) == tok.decode(ids, skip_special_tokens=True)
