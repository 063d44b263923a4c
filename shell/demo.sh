#!/usr/bin/env bash
# One command for a new machine: install, then run the CPU demo on its embedded default.
# Usage: bash shell/demo.sh [asp demo options]   (output goes to runs/demo/ unless --out is given)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/shell/setup_env.sh" cpu,test
cd "$root"
# --overwrite: re-running the demo replaces its previous runs under runs/demo (asp demo alone refuses to)
exec "${ASP_VENV:-$root/.venv}/bin/asp" demo --overwrite "$@"
