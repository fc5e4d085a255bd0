#!/usr/bin/env bash
# Make sure a headless Chromium is here: the dashboard's browser test loads
# the page in it. Installs Debian's package when missing.
set -euo pipefail
status=0
bash "$(dirname "$0")/apt-package.sh" chromium chromium || status=$?
if [ "$status" != 0 ] && [ "$status" != 10 ]; then
    exit "$status"
fi
