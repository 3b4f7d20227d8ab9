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
# The dashboard's browser test (tests/e2e/test_dashboard_browser.py) drives Debian's Chromium and its driver.
# Installed only when missing; without root (or apt) the test skips and says why.
if ! { [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; }; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium and chromium-driver for the dashboard's browser test"
    if ! { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }; then
      echo "warning: chromium could not be installed; the dashboard's browser test will be skipped" >&2
    fi
  else
    echo "note: not root (or no apt-get): chromium is not installed; the dashboard's browser test will be skipped" >&2
  fi
fi
# The fault suite's clock-step scenario (tests/faults/test_clock_faults.py) preloads Debian's libfaketime.
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing libfaketime for the fault suite's clock step"
    if ! { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfaketime >/dev/null; }; then
      echo "warning: libfaketime could not be installed; the clock-step scenario will be skipped" >&2
    fi
  else
    echo "note: not root (or no apt-get): libfaketime is not installed; the clock-step scenario will be skipped" >&2
  fi
fi
echo "examlops installed in $venv"
