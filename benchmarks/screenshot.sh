#!/usr/bin/env bash
# A PNG of a whole HTML report, taken with headless Chromium (Debian: apt-get install -y chromium).
#   bash benchmarks/screenshot.sh report.html report.png [WIDTH]
# The page's own script records its height once rendered; the screenshot is then taken at that height.
set -euo pipefail
html=$(realpath "$1"); png=$2; width=${3:-1500}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "screenshot.sh: no chromium found" >&2; exit 2; }
flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --virtual-time-budget=3000)
height=$("$browser" "${flags[@]}" --window-size="$width,1000" --dump-dom "file://$html" 2>/dev/null \
  | grep -o 'data-height="[0-9]*"' | head -1 | grep -o '[0-9][0-9]*' || true)
"$browser" "${flags[@]}" --window-size="$width,${height:-3000}" --screenshot="$png" "file://$html" 2>/dev/null
echo "wrote $png (${width}x${height:-3000})"
