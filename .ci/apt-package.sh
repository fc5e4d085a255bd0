#!/usr/bin/env bash
# .ci/apt-package.sh COMMAND PACKAGE: make sure COMMAND is here, installing
# Debian's PACKAGE when it is not. Runs apt-get as root (CI) or through
# sudo -n elsewhere, never asking a question. Exits 10 after an install,
# so that a caller can tidy up after the package.
set -euo pipefail
command="$1"
package="$2"
if command -v "$command" >/dev/null 2>&1 || [ -x "/usr/bin/$command" ]; then
    exit 0
fi
sudo=()
if [ "$(id -u)" != "0" ]; then
    sudo=(sudo -n)
fi
echo "$command is missing: installing Debian's package $package" >&2
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq "$package" >/dev/null
exit 10
