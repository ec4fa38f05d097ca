#!/usr/bin/env bash
# Runs on the GPU machine, once per part folder, in any order: stages the part, and
# once every part is staged installs the kit into /tmp/site (or $KIT_SITE) and
# prints what loads and what is missing. Then: export PYTHONPATH=/tmp/site
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python3 "$here/kit.py" install "$here" "${KIT_SITE:-/tmp/site}"
