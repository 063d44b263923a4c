#!/usr/bin/env bash
# One command for a new machine: install, then run the test suite (the same command CI runs).
# Usage: bash shell/test.sh [pytest options]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/shell/setup_env.sh" cpu,test
cd "$root"
exec "${ASP_VENV:-$root/.venv}/bin/python" -m pytest "$@"
