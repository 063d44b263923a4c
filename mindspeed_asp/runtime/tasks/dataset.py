"""The `dataset` task: text prompts with reference answers from a JSONL file, graded by math verification.

File format (JSON Lines, one object per line; a file holding one JSON array of such objects also reads):

    {"id": "gsm8k-17", "prompt": "What is 12 + 30? Put your final answer within \\boxed{}.", "answer": "42"}
    {"prompt": "Half of 1?", "answer": "1/2", "source": "arith"}

- `prompt` (non-empty string): the user turn. With a tokenizer that has a chat template it is sent as one user
  message with the generation prompt added; without one the raw text is encoded (with the tokenizer's own
  special tokens, e.g. a BOS).
- `answer` (non-empty string): the reference answer.
- `id` (optional, non-empty string or integer, unique): the prompt id in logs, plans and the length history;
  default: the 0-based index of the record in the file.
- `source` (optional string): the data source (a cold-start feature of the length estimators).
Any other key, a blank or non-string `prompt`/`answer`, a duplicate id, a prompt whose tokens do not leave
`data.max_new_tokens` inside `model.max_model_len`, or a file without prompts is refused naming the file,
line and key. `data.dataset.limit` keeps the first `limit` records (later lines are not read).

Why token ids: the task tokenises the prompts itself and decodes the responses in the reward, so vLLM keeps
running with token-id prompts and `skip_tokenizer_init` (runtime/instance.py), as for every other task.

Reward (`answer_reward`): 1.0 if the decoded response (special tokens dropped) is mathematically equal to
the answer, else 0.0. Both are parsed with math-verify (`math_verify.parse`: `\\boxed{}`, LaTeX in `$...$`,
plain numbers and expressions) and compared with `math_verify.verify` (so `\\boxed{3}` = "3" and "1/2" =
"0.5"). Only when the answer itself does not parse (free text such as "Paris"; LaTeX without delimiters such
as `x^2` - write `$x^2$`) is it compared as a string: the stripped answer must equal the stripped content of
the response's last `\\boxed{}`, or the whole stripped response when it has none.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from mindspeed_asp.utils.atomic import atomic_open
from mindspeed_asp.errors import ConfigError, InputError
from mindspeed_asp.utils.jsonl import iter_json_objects
from mindspeed_asp.runtime.rewards import last_boxed
from mindspeed_asp.runtime.tasks.base import GenerationLimits, check_group
from mindspeed_asp.core.problem import PromptSet

PathLike = Union[str, Path]
SCHEMA = "mindspeed_asp.dataset_task/1"
KEYS = ("id", "prompt", "answer", "source")
#: math-verify bounds each parse and comparison with SIGALRM, which only the main thread may set; elsewhere
#: (a reward computed on a worker thread) it runs without a time bound rather than raising.
VERIFY_TIMEOUT_S = 5


@dataclass(frozen=True)
class DatasetPrompt:
    """One record of the file, tokenised."""

    prompt_id: str
    prompt: str
    answer: str
    token_ids: Tuple[int, ...]
    line: int
    source: Optional[str] = None


def _timeout() -> Optional[int]:
    return VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=65536)
def _parsed_answer(answer: str) -> Tuple[Any, ...]:
    """The reference answer as math-verify parses it (cached: every sample of a group grades against it)."""
    from math_verify import parse

    return tuple(parse(answer, parsing_timeout=_timeout()))


def answer_reward(response: str, answer: str) -> float:
    """1.0 if `response` states `answer` (math-verify equivalence; string match if the answer does not parse)."""
    gold = _parsed_answer(answer)
    if not gold:
        boxed = last_boxed(response)
        said = boxed if boxed is not None else response
        return 1.0 if said.strip() == answer.strip() else 0.0
    from math_verify import parse, verify

    timeout = _timeout()
    pred = parse(response, parsing_timeout=timeout)
    if not pred:
        return 0.0
    return 1.0 if verify(list(gold), pred, timeout_seconds=timeout) else 0.0


#: Files one of which a model directory's tokenizer is saved as (fast, sentencepiece, BPE, WordPiece).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tokenizer_config.json")


def load_tokenizer(model_path: str) -> Any:
    """The model directory's own tokenizer (local files only), or a ConfigError naming the directory.

    Why the file check: transformers 5 builds an empty tokenizer of the model's type (vocabulary of one,
    every prompt encoding to nothing) from a directory that has no tokenizer files at all."""
    from transformers import AutoTokenizer

    why = "the dataset task encodes text prompts and decodes responses with the model's tokenizer"
    if not any(Path(model_path, f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"no usable tokenizer in {model_path}: none of {', '.join(TOKENIZER_FILES)} ({why})",
                          key="model.path")
    try:
        tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"no usable tokenizer in {model_path} ({why}): {first}", key="model.path") from None
    if len(tok) < 2:
        raise ConfigError(f"no usable tokenizer in {model_path}: its vocabulary has {len(tok)} token(s) ({why})",
                          key="model.path")
    return tok


def _model_vocab_size(model_path: str) -> Optional[int]:
    try:
        size = json.loads(Path(model_path, "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError):
        return None
    return int(size) if isinstance(size, int) and not isinstance(size, bool) else None


class DatasetTask:
    """Prompts and answers from a JSONL file, the model's tokenizer, and the math-verify rule reward.

    `max_new_tokens` (the run's `data.max_new_tokens`) is every prompt's cap; a prompt may use at most
    `max_model_len - max_new_tokens` tokens. `tokenizer` defaults to the one in `model_path`.
    """

    def __init__(self, path: PathLike, model_path: str, max_new_tokens: int, max_model_len: int,
                 limit: Optional[int] = None, tokenizer: Any = None) -> None:
        if max_new_tokens < 1 or max_new_tokens >= max_model_len:
            raise ConfigError(f"max_new_tokens={max_new_tokens} must be in 1 .. max_model_len - 1 "
                              f"({max_model_len - 1})", key="data.max_new_tokens")
        if limit is not None and limit < 1:
            raise ConfigError(f"limit must be >= 1, got {limit}", key="data.dataset.limit")
        self.path = str(path)
        self.model_path = str(model_path)
        self.max_new_tokens, self.max_model_len, self.limit = int(max_new_tokens), int(max_model_len), limit
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.model_path)
        self.chat_template = bool(getattr(self.tokenizer, "chat_template", None))
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            raise ConfigError(f"the tokenizer in {self.model_path} has no EOS token (eos_token in "
                              "tokenizer_config.json): responses could never end", key="model.path")
        self.eos_token_id = int(eos)
        self.vocab_size = _model_vocab_size(self.model_path)
        self._prompts = self._read()
        self._by_id = {p.prompt_id: p for p in self._prompts}

    # ------------------------------------------------------------------ reading
    def _read(self) -> List[DatasetPrompt]:
        room = self.max_model_len - self.max_new_tokens
        seen: dict = {}
        out: List[DatasetPrompt] = []
        for line, rec in iter_json_objects(self.path):
            if self.limit is not None and len(out) >= self.limit:
                break
            unknown = sorted(set(rec) - set(KEYS))
            if unknown:
                raise InputError(f"unknown key (a record has {', '.join(KEYS)})", path=self.path, line=line,
                                 key=unknown[0])
            prompt = self._text(rec, "prompt", line)
            answer = self._text(rec, "answer", line)
            pid = self._prompt_id(rec, len(out), line)
            if pid in seen:
                raise InputError(f"duplicate prompt id {pid!r} (first on line {seen[pid]})", path=self.path,
                                 line=line, key="id")
            seen[pid] = line
            source = rec.get("source")
            if source is not None and not isinstance(source, str):
                raise InputError(f"source must be a string, got {type(source).__name__}", path=self.path,
                                 line=line, key="source")
            ids = self.encode(prompt)
            if not ids:
                raise InputError("prompt encodes to no tokens", path=self.path, line=line, key="prompt")
            if len(ids) > room:
                raise InputError(f"prompt of {len(ids)} tokens is longer than model.max_model_len - "
                                 f"data.max_new_tokens = {self.max_model_len} - {self.max_new_tokens} = {room}",
                                 path=self.path, line=line, key="prompt")
            if self.vocab_size is not None and max(ids) >= self.vocab_size:
                raise InputError(f"token id {max(ids)} is outside the model's vocabulary of {self.vocab_size} "
                                 f"(tokenizer and model in {self.model_path} do not match)", path=self.path,
                                 line=line, key="prompt")
            out.append(DatasetPrompt(pid, prompt, answer, tuple(ids), line, source))
        if not out:
            raise InputError("no prompts in file (one JSON object per line with 'prompt' and 'answer')",
                             path=self.path)
        return out

    def _text(self, rec: dict, key: str, line: int) -> str:
        if key not in rec:
            raise InputError("missing key", path=self.path, line=line, key=key)
        value = rec[key]
        if not isinstance(value, str):
            raise InputError(f"{key} must be a string, got {type(value).__name__}", path=self.path, line=line,
                             key=key)
        if not value.strip():
            raise InputError(f"{key} is empty", path=self.path, line=line, key=key)
        return value

    def _prompt_id(self, rec: dict, index: int, line: int) -> str:
        if "id" not in rec:
            return str(index)
        pid = rec["id"]
        if isinstance(pid, bool) or not isinstance(pid, (str, int)) or (isinstance(pid, str) and not pid.strip()):
            raise InputError(f"id must be a non-empty string or an integer, got {pid!r}", path=self.path, line=line,
                             key="id")
        return str(pid)

    def encode(self, prompt: str) -> List[int]:
        """Token ids of one prompt: the chat template's user turn plus generation prompt, else the raw text."""
        tok = self.tokenizer
        if self.chat_template:
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True)
            return [int(t) for t in tok.encode(text, add_special_tokens=False)]
        return [int(t) for t in tok.encode(prompt, add_special_tokens=True)]

    # ------------------------------------------------------------------ the task interface
    def __len__(self) -> int:
        return len(self._prompts)

    def prompts(self) -> List[Tuple[str, List[int], int]]:
        """(prompt_id, prompt_token_ids, max_new_tokens) per prompt, in file order."""
        return [(p.prompt_id, list(p.token_ids), self.max_new_tokens) for p in self._prompts]

    def limits(self, prompt_index: int, epoch: int) -> GenerationLimits:
        """Every prompt, every epoch: up to `data.max_new_tokens`, stopping at EOS."""
        check_group(prompt_index, epoch, len(self._prompts))
        return GenerationLimits(max_new_tokens=self.max_new_tokens)

    def prompt(self, prompt_id: str) -> DatasetPrompt:
        try:
            return self._by_id[str(prompt_id)]
        except KeyError:
            raise KeyError(f"unknown prompt id {prompt_id!r} in {self.path}") from None

    def response_text(self, token_ids: Sequence[int]) -> str:
        """The response as the reward reads it: decoded, special tokens (the final EOS) dropped."""
        return self.tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=True)

    def reward(self, prompt_id: str, token_ids: Sequence[int]) -> float:
        """1.0 if the decoded response states the prompt's answer, else 0.0 (see `answer_reward`)."""
        return answer_reward(self.response_text(token_ids), self.prompt(prompt_id).answer)

    def prompt_set(self, n: int) -> PromptSet:
        """The PromptSet of this dataset (what a plan file must have been built for), n samples per prompt."""
        has_src = any(p.source is not None for p in self._prompts)
        return PromptSet(prompt_ids=np.array([p.prompt_id for p in self._prompts], dtype=object),
                         prompt_lens=np.array([len(p.token_ids) for p in self._prompts], dtype=np.int64), n=n,
                         sources=(np.array([p.source or "" for p in self._prompts], dtype=object) if has_src
                                  else None),
                         origin=f"dataset {self.path}" + (f" (limit={self.limit})" if self.limit else ""))

    def to_jsonl(self, path: PathLike) -> str:
        """Write the tokenised dataset: prompt_id, prompt_len, prompt_token_ids (what `asp plan` reads), plus
        max_new_tokens, the prompt text, the answer, source and the line of the input file, for humans."""
        path = Path(path)
        with atomic_open(path) as fh:
            for p in self._prompts:
                fh.write(json.dumps({"prompt_id": p.prompt_id, "prompt_len": len(p.token_ids),
                                     "prompt_token_ids": list(p.token_ids), "max_new_tokens": self.max_new_tokens,
                                     "prompt": p.prompt, "answer": p.answer, "source": p.source or "dataset",
                                     "file": self.path, "line": p.line}) + "\n")
        return str(path)

    def describe(self) -> dict:
        """Summary for logs: size, prompt lengths, the cap, EOS and whether the chat template was used."""
        lens = np.array([len(p.token_ids) for p in self._prompts])
        return {"schema": SCHEMA, "path": self.path, "num_prompts": len(self._prompts),
                "prompt_len_mean": float(lens.mean()), "prompt_len_max": int(lens.max()),
                "max_new_tokens": self.max_new_tokens, "eos_token_id": self.eos_token_id,
                "chat_template": self.chat_template}


def build_dataset_task(cfg: Any, model_path: str) -> DatasetTask:
    """The dataset task of a run config (`data.task: dataset`, section `data.dataset`).

    With `model.tiny` the tiny model gets its tiny tokenizer first (runtime/tiny_tokenizer.py). A dataset
    with fewer prompts than one minibatch is refused: no update could ever be trained.
    """
    section = getattr(cfg.data, "dataset", None)
    if section is None or not section.path:
        raise ConfigError("data.task is dataset, so data.dataset.path must name the JSONL file of prompts and "
                          "answers", key="data.dataset.path")
    if cfg.model.tiny:
        from mindspeed_asp.runtime.tiny_tokenizer import ensure_tiny_tokenizer

        ensure_tiny_tokenizer(model_path)
    task = DatasetTask(section.path, model_path, max_new_tokens=cfg.data.max_new_tokens,
                       max_model_len=cfg.model.max_model_len, limit=section.limit)
    if len(task) < cfg.asp.minibatch_groups:
        raise ConfigError(f"{len(task)} prompts in {section.path}, fewer than one minibatch of "
                          f"asp.minibatch_groups={cfg.asp.minibatch_groups} groups", key="asp.minibatch_groups")
    return task
