#!/usr/bin/env bash
# Create the virtual environment and install the locked dependencies and examlops itself.
# uv installs in seconds; it must compile bytecode, or every `import evidently` costs
# 12-15 s where PYTHONDONTWRITEBYTECODE is set. pip is the fallback.
# requirements.lock holds the dev and ray extras, so the Ray engine's tests run here and in CI:
#   uv pip compile pyproject.toml --extra dev --extra ray -p 3.11 -o requirements.lock
set -euo pipefail
python=${1:-python3}
venv=${2:-.venv}
"$python" -c 'import sys; assert sys.version_info[:2] in ((3, 11), (3, 12)), "examlops needs Python 3.11 or 3.12"'
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
if "$venv/bin/python" -m pip install --quiet uv >/dev/null 2>&1; then
  "$venv/bin/uv" pip install --python "$venv/bin/python" --compile-bytecode -r requirements.lock
  "$venv/bin/uv" pip install --python "$venv/bin/python" --compile-bytecode --no-deps -e .
else
  "$venv/bin/python" -m pip install --quiet -r requirements.lock
  "$venv/bin/python" -m pip install --quiet --no-deps -e .
fi
# Debian packages some tests drive, installed only when missing; without root (or apt-get) those tests
# skip and say why (CI requires Postgres: .ci/run).
apt_install() {  # apt_install "<what needs them>" <package>...
  local purpose=$1; shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing $* for $purpose"
    if ! { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; }; then
      echo "warning: $* could not be installed; $purpose will be skipped" >&2
    fi
  else
    echo "note: not root (or no apt-get): $* not installed; $purpose will be skipped" >&2
  fi
}
# The dashboard's browser test (tests/e2e/test_dashboard_browser.py) drives Debian's Chromium and its driver.
[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] ||
  apt_install "the dashboard's browser test" chromium chromium-driver
# The SQL tests run on SQLite and on a real Postgres that a fixture starts in a temp folder
# (tests/integration/conftest.py): it needs the server's programs.
command -v pg_ctl >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 ||
  apt_install "the SQL tests on Postgres" postgresql
# The fault suite's clock-step scenario (tests/faults/test_clock_faults.py) preloads libfaketime.
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] ||
  apt_install "the fault suite's clock-step scenario" libfaketime
echo "examlops installed in $venv"
