"""Inputs several test directories build the same way: one definition each, imported by name.

Plain functions rather than fixtures because tests call them with arguments and inside parametrize lists.
`tests/` is on the import path for every test (pytest puts the root conftest's directory there).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHELL = ROOT / "shell"


# ------------------------------------------------------------------------------------------ `asp plan` inputs
def write_inputs(tmp: Path, G: int = 40, n: int = 4, epochs: int = 2, seed: int = 0):
    rng = np.random.default_rng(seed)
    data = tmp / "prompts.jsonl"
    hist = tmp / "history.jsonl"
    mu = rng.lognormal(5, 0.9, G)
    with data.open("w") as fh:
        for i in range(G):
            fh.write(json.dumps({"prompt_id": f"q{i}", "prompt_len": int(rng.integers(10, 300))}) + "\n")
    with hist.open("w") as fh:
        for e in range(epochs):
            for i in range(G):
                lens = np.minimum(np.rint(mu[i] * rng.lognormal(0, 0.4, n)), 1024).astype(int).tolist()
                fh.write(json.dumps({"prompt_id": f"q{i}", "epoch": e, "lengths": lens}) + "\n")
    return data, hist


def base_args(data, hist, out, *extra):
    return ["plan", "--dataset", str(data), "--history", str(hist), "--instances", "4", "--slots", "16",
            "--minibatch", "4", "--n", "4", "--no-progress", "-o", str(out), *extra]


# ------------------------------------------------------------------------------------------ MindSpeed-RL root
def fake_msrl(tmp_path: Path) -> Path:
    """A MindSpeed-RL root as the launcher needs it without NPUs: the package directory, and the model group
    of configs/ that every ASP config's defaults list names (one empty file per model, for Hydra's compose)."""
    import yaml
    msrl = tmp_path / "MindSpeed-RL"
    (msrl / "mindspeed_rl").mkdir(parents=True, exist_ok=True)
    (msrl / "configs" / "model").mkdir(parents=True, exist_ok=True)
    for cfg in (ROOT / "configs").glob("*_asp.yaml"):
        for entry in yaml.safe_load(cfg.read_text()).get("defaults", []):
            for name in (entry.get("model", []) if isinstance(entry, dict) else []):
                (msrl / "configs" / "model" / f"{name}.yaml").write_text(f"{name}_marker: 1\n")
    return msrl
