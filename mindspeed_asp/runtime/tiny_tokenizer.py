"""A tiny byte-level BPE tokenizer saved next to the tiny Qwen2 model, so text tasks run on the CPU tier.

Why: the tiny model (`tiny_model.py`) has no tokenizer, which is enough for token-id tasks (the demo task) but
not for a dataset of text prompts with a rule reward on the decoded response (`tasks/dataset.py`). Nothing
is downloaded: the tokenizer is trained in code on a fixed corpus of arithmetic and ChatML text (byte-level,
so any text encodes; the merges only make prompts shorter) and saved as `tokenizer.json` plus a
`PreTrainedTokenizerFast` config, which `transformers.AutoTokenizer` loads from the model directory.

Ids match the tiny model: 0 = `<|endoftext|>` (BOS/pad, `BOS_TOKEN_ID`), 1 = `<|im_end|>` (EOS,
`EOS_TOKEN_ID`), 2 = `<|im_start|>`; the vocabulary (`VOCAB_SIZE`) is below the model's 512, so every prompt
id is one the model embeds. Ids the model emits above the tokenizer's vocabulary decode to nothing (as the
padded embedding rows of real models do). Like Qwen's tokenizers, `encode` adds no BOS/EOS, and a ChatML
chat template is included (`chat_template=False` leaves it out, for the raw-prompt path).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict

from mindspeed_asp.runtime.tiny_model import BOS_TOKEN_ID, EOS_TOKEN_ID

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|im_start|>")  # ids 0, 1, 2 (trainer order)
VOCAB_SIZE = 384
CHATML_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                   "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_CORPUS = [
    "What is 12 + 30? Put your final answer within \\boxed{}.",
    "Compute 7 * 8 - 5. The answer is \\boxed{51}.",
    "Let x = 3, then 2x + 1 = 7. So the answer is 7.",
    "What is 1/2 + 1/4? The answer is \\frac{3}{4} = 0.75.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 50 100",
    "plus minus times divided by equals sum product difference quotient",
    "system\nYou are a helpful assistant.\nuser\nassistant\n",
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it.",
]
_MARKER = "asp_tiny_tokenizer.json"
_FORMAT = {"format": 1, "vocab_size": VOCAB_SIZE}


def build_tiny_tokenizer(path: str | Path, chat_template: bool = True) -> str:
    """Train the tokenizer and save it in `path` (created if missing; existing tokenizer files replaced).

    Deterministic: the corpus, the trainer settings and the special tokens are fixed, so two builds give the
    same vocabulary and merges (the ids of a dataset's prompts, hence its plan fingerprint, do not move).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_CORPUS * 8, trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    if ids[SPECIAL_TOKENS[0]] != BOS_TOKEN_ID or ids[SPECIAL_TOKENS[1]] != EOS_TOKEN_ID:
        raise RuntimeError(f"tiny tokenizer special ids {ids} do not match the tiny model's BOS "
                           f"{BOS_TOKEN_ID} / EOS {EOS_TOKEN_ID}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL_TOKENS[0], eos_token=SPECIAL_TOKENS[1],
                                   pad_token=SPECIAL_TOKENS[0], additional_special_tokens=[SPECIAL_TOKENS[2]],
                                   clean_up_tokenization_spaces=False)
    if chat_template:
        fast.chat_template = CHATML_TEMPLATE
    target = Path(path)
    target.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(target))
    return str(target)


def ensure_tiny_tokenizer(model_dir: str | Path) -> str:
    """Save the tiny tokenizer into the tiny model's directory once (idempotent, one writer at a time).

    A directory whose marker says it already holds this tokenizer is left alone; files go to a private temp
    directory first and are moved in with the marker last, so a directory with the marker is complete.
    """
    target = Path(model_dir)
    if not (target / "config.json").is_file():
        raise FileNotFoundError(f"{target} is not a model directory (no config.json); build the tiny model first")
    with open(target.parent / (target.name + ".tokenizer.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = target / _MARKER
        if marker.is_file() and _read_marker(marker) == _FORMAT and (target / "tokenizer.json").is_file():
            return str(target)
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tok", dir=str(target.parent)))
        try:
            build_tiny_tokenizer(tmp)
            (tmp / _MARKER).write_text(json.dumps(_FORMAT))
            for item in sorted(tmp.iterdir(), key=lambda p: p.name == _MARKER):
                os.replace(item, target / item.name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def _read_marker(marker: Path) -> Dict[str, object]:
    try:
        got = json.loads(marker.read_text())
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}
