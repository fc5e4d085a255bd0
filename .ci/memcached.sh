#!/usr/bin/env bash
# Make sure a memcached binary is here: the tests start their own servers
# on free ports and stop them. Installs Debian's package when missing.
set -euo pipefail
status=0
bash "$(dirname "$0")/apt-package.sh" memcached memcached || status=$?
if [ "$status" = 10 ]; then
    # The package starts a system memcached on 11211; the tests do not
    # use it.
    sudo=""
    if [ "$(id -u)" != "0" ]; then
        sudo="sudo -n"
    fi
    ($sudo service memcached stop || true) >/dev/null 2>&1
elif [ "$status" != 0 ]; then
    exit "$status"
fi
