#!/usr/bin/env bash
# Check buildout.cfg as a zc.buildout user meets it: a fresh clone of the
# committed HEAD, `buildout` in it, then its bin/pytest. Slow (it fetches
# every egg), so it is `make buildout`, not part of `make test`.
# PYTEST_ARGS picks the tests bin/pytest runs (default: all of them).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
git clone --quiet "$repo" "$work/clone"
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet zc.buildout
cd "$work/clone"
start=$(date +%s)
"$work/venv/bin/buildout" -q
echo "buildout: $(( $(date +%s) - start )) s" >&2
test -x bin/py && test -x bin/pytest
bin/py -c 'import pyramid_dbtune, pyramid_zcml, accommodation'
# shellcheck disable=SC2086  # PYTEST_ARGS is a list of words
bin/pytest -p no:cacheprovider ${PYTEST_ARGS:-}
