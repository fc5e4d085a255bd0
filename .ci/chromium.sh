#!/usr/bin/env bash
# Make sure a headless Chromium is here: the dashboard's browser test loads
# the page in it. Installs Debian's package when missing (CI runs as root;
# elsewhere sudo is tried).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    SUDO="sudo -n"
fi
echo "chromium is missing: installing Debian's package" >&2
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
