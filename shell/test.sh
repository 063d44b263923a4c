#!/usr/bin/env bash
# One command for a new machine: install, then run the test suite (the same command CI runs).
# Usage: bash shell/test.sh [pytest options]
# Without options (CI): first the fast tier in a core-only install (.venv-core: the core and pytest, no torch,
# no Ray), so the promise "plans and simulates without torch" is tested, then ruff and the whole suite in the
# full install (.venv). With pytest options: only the full install, with those options.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ASP_VENV:-$root/.venv}"
cd "$root"
if [ "$#" -eq 0 ]; then
  core="${ASP_CORE_VENV:-$root/.venv-core}"
  ASP_VENV="$core" bash "$root/shell/setup_env.sh" test-core
  echo "[test] fast tier in the core-only install ($core)"
  "$core/bin/python" -m pytest -q -m "not slow and not vllm" -p no:cacheprovider
fi
bash "$root/shell/setup_env.sh" cpu,test
if [ "$#" -eq 0 ]; then
  echo "[test] ruff check (ruff.toml)"
  "$venv/bin/python" -m ruff check "$root"
fi
exec "$venv/bin/python" -m pytest "$@"
