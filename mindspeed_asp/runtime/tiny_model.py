"""A tiny random-initialised Qwen2 model saved locally, for the CPU tier (tests, demo, `asp fit-cost`).

Why Qwen2: it is an architecture both vLLM and transformers load from the same `config.json` +
`model.safetensors`, so the HF model the reference trainer trains exports exactly the parameter names
vLLM's `load_weights` expects. Nothing is downloaded: the config is built in code and the weights are
random (seeded). CPU attention in vLLM needs head_dim >= 32.

Token ids: the model has no tokenizer (vLLM runs with `skip_tokenizer_init=True` and token-id prompts).
Ids 0 (bos/pad) and 1 (eos) are reserved; a task may use ids 2..vocab_size-1.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

BOS_TOKEN_ID = 0
EOS_TOKEN_ID = 1
FIRST_FREE_TOKEN_ID = 2

DEFAULT_SHAPE: Dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}

_MARKER = "asp_tiny_model.json"


def default_cache_dir(seed: int = 0) -> Path:
    """Where the tiny model lives unless a directory is given (ASP_CACHE_DIR overrides ~/.cache): one directory
    per weight seed, so runs with different `model.init_seed` never rebuild each other's model."""
    root = os.environ.get("ASP_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "mindspeed_asp")
    return Path(root) / ("tiny-qwen2" if int(seed) == 0 else f"tiny-qwen2-seed{int(seed)}")


def ensure_tiny_model(path: Optional[str] = None, seed: int = 0, **shape: Any) -> str:
    """Create (once) a tiny random Qwen2 model in `path` and return the directory.

    Idempotent: if the directory already holds a model made with the same seed and shape it is reused,
    so tests and the demo share one copy. A directory holding a different tiny model is rebuilt; a
    directory holding anything else is refused (we never overwrite a user's model).
    """
    unknown = set(shape) - set(DEFAULT_SHAPE)
    if unknown:
        raise ValueError(f"unknown tiny-model shape keys: {sorted(unknown)}; known: {sorted(DEFAULT_SHAPE)}")
    spec = dict(DEFAULT_SHAPE, **shape)
    if spec["head_dim"] < 32:
        raise ValueError("head_dim must be >= 32 (vLLM's CPU attention supports 32, 64, 80, ...)")
    target = Path(path) if path else default_cache_dir(seed)
    wanted = {"seed": seed, "shape": spec, "format": 1}
    target.parent.mkdir(parents=True, exist_ok=True)
    # One writer at a time (tests, the demo and instances may ask at once); the others then reuse it.
    with open(target.parent / (target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_locked(target, wanted, spec, seed)


def _ensure_locked(target: Path, wanted: Dict[str, Any], spec: Dict[str, Any], seed: int) -> str:
    marker = target / _MARKER
    if marker.exists():
        try:
            if json.loads(marker.read_text()) == wanted and (target / "config.json").exists():
                return str(target)
        except ValueError:
            pass
    elif target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} exists and is not a tiny model made by mindspeed_asp; pass another path")

    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=BOS_TOKEN_ID,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        torch_dtype="float32",
        **spec,
    )
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG state
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    target.mkdir(parents=True, exist_ok=True)
    # Write to a private temp dir, then move the files in with the marker last: a directory with a
    # marker is always complete.
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp", dir=str(target.parent)))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        GenerationConfig(bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID,
                         pad_token_id=BOS_TOKEN_ID).save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps(wanted))
        for item in sorted(tmp.iterdir(), key=lambda p: p.name == _MARKER):
            os.replace(item, target / item.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def run_model_path(model: Any) -> str:
    """The model directory a run's `model:` section names: the tiny model (built into the cache or at
    `model.path` if missing) with `tiny: true`, else an existing HF model directory."""
    from mindspeed_asp.errors import RunError

    if model.tiny:
        return ensure_tiny_model(model.path, seed=model.init_seed)
    if not Path(model.path, "config.json").is_file():
        raise RunError(f"model.path {model.path!r} is not an HF model directory (no config.json)")
    return str(model.path)


def load_hf_model(path: str, dtype: str = "float32"):
    """The HF causal LM the reference trainer trains: same directory, same parameter names as vLLM loads."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
