"""A small byte-level BPE tokenizer with Qwen's ChatML special tokens, built offline (no hub download).

Test-only. Like Qwen2.5/Qwen3's tokenizers: byte-level BPE with GPT-2's pre-tokenizer regex, no BOS/EOS
added by `encode`, and `<|im_start|>` / `<|im_end|>` registered as additional special tokens (so
`decode(..., skip_special_tokens=True)` drops them, as it does for Qwen).
"""
from __future__ import annotations

from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it.",
    "The assistant first thinks about the reasoning process in the mind and then provides the answer.",
    "<think> reasoning process here </think><answer> answer here </answer>",
    "Put your final answer within \\boxed{}. What is 12 + 30? Let x = 3, then 2x + 1 = 7.",
    "system\nYou are a helpful assistant.\nuser\nassistant\n",
] * 20


def build_chatml_tokenizer(path: Path) -> str:
    """Train and save the tokenizer in `path` (a transformers-loadable directory); returns the path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL[1:])
    path.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(path))
    return str(path)
