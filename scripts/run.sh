#!/usr/bin/env bash
# The main job: set up the environment (first run only), then generate text.
# Usage: bash scripts/run.sh [ringgpt generate options] ["prompt"]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec ringgpt generate "$@"
