#!/usr/bin/env bash
# Chromium for the browser tests (tests/test_html.py): Debian's package, never a browser
# download. Installs it with apt-get when /usr/bin/chromium is missing and we are root;
# otherwise says why the browser tests will skip. Sourced or run by scripts/test.sh.
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "browser.sh: installing Debian's chromium for the browser tests" >&2
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } >/dev/null \
      || echo "browser.sh: could not install chromium; the browser tests will skip" >&2
  else
    echo "browser.sh: /usr/bin/chromium missing and not root; the browser tests will skip" >&2
  fi
fi
true
