#!/usr/bin/env bash
# Make sure a memcached binary is here: the tests start their own servers
# on free ports and stop them. Installs Debian's package when missing (CI
# runs as root; elsewhere sudo is tried).
set -euo pipefail
if command -v memcached >/dev/null 2>&1; then
    exit 0
fi
if [ -x /usr/bin/memcached ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    SUDO="sudo -n"
fi
echo "memcached is missing: installing Debian's package" >&2
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq memcached >/dev/null
# The package starts a system memcached on 11211; the tests do not use it.
($SUDO service memcached stop || true) >/dev/null 2>&1
