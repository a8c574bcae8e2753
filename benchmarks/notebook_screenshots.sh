#!/usr/bin/env bash
# Screenshot notebooks 03 and 04 in JupyterLab as a student sees them, in a real browser (Debian's chromium,
# headless), after executing them: evidence that every figure renders on screen (issue 30), kept in
# docs/screenshots/.
#
# Why: tests/test_notebook_figures.py proves that each plotting cell emits an image/png under nbclient; this shows
# JupyterLab itself drawing them, served by scripts/start-notebooks.sh exactly as a student starts it. The
# executed copies go to results/notebook-screenshots/ (git-ignored, inside the folder JupyterLab serves), never
# into notebooks/, which are committed without outputs.
#
#   bash benchmarks/notebook_screenshots.sh [OUT_DIR]      default OUT_DIR: docs/screenshots
#   needs: .venv with the [notebooks] extra, chromium (apt-get install -y chromium); LAB_PROFILE defaults to ci
#   LAB_SCREENSHOT_PORT   JupyterLab's port (default 8899); LAB_SCREENSHOT_HEIGHT   window height (default 5200)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out=$(realpath -m "${1:-$repo/docs/screenshots}")
port=${LAB_SCREENSHOT_PORT:-8899}
height=${LAB_SCREENSHOT_HEIGHT:-5200}
venv="${LAB_VENV:-$repo/.venv}"
export LAB_PROFILE=${LAB_PROFILE:-ci} HF_HUB_OFFLINE=1
command -v chromium >/dev/null || { echo "notebook_screenshots: chromium is not installed (apt-get install -y chromium)" >&2; exit 1; }

work="$repo/results/notebook-screenshots"
scratch=$(mktemp -d)
server=
cleanup() {
    [[ -z $server ]] || { kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null || true; }
    rm -rf "$scratch"
}
trap cleanup EXIT
mkdir -p "$work" "$out"

for nb in 03_compare 04_what_if; do
    echo "executing notebooks/$nb.ipynb -> ${work#"$repo"/}/$nb.ipynb"
    "$venv/bin/jupyter" nbconvert --to notebook --execute --ExecutePreprocessor.timeout=900 \
        --output-dir "$work" "$repo/notebooks/$nb.ipynb" 2>&1 | tail -n 1
done

# JupyterLab's own settings for this run only: no news popup over the notebook, every cell rendered (windowing
# off: a headless window shows only what JupyterLab has drawn).
settings="$scratch/settings"
mkdir -p "$settings/@jupyterlab/apputils-extension" "$settings/@jupyterlab/notebook-extension"
echo '{"fetchNews": "false", "checkForUpdates": false}' >"$settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"
echo '{"windowingMode": "none"}' >"$settings/@jupyterlab/notebook-extension/tracker.jupyterlab-settings"

LAB_TOKEN_FILE="$scratch/token" JUPYTERLAB_SETTINGS_DIR="$settings" LAB_RESULTS="$scratch" \
    bash "$repo/scripts/start-notebooks.sh" --port "$port" >"$scratch/server.out" 2>&1 &
server=$!
for _ in $(seq 120); do
    grep -q "token=" "$scratch/server.out" 2>/dev/null && break
    kill -0 "$server" 2>/dev/null || { cat "$scratch/server.out" >&2; exit 1; }
    sleep 1
done
token=$(<"$scratch/token")

for nb in 03_compare 04_what_if; do
    url="http://127.0.0.1:$port/lab/tree/results/notebook-screenshots/$nb.ipynb?token=$token"
    chromium --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
        --disable-sync --no-first-run --user-data-dir="$scratch/chromium-$nb" --hide-scrollbars \
        --window-size="1400,$height" --virtual-time-budget=45000 --screenshot="$out/$nb.png" "$url" \
        >"$scratch/chromium-$nb.log" 2>&1 || { tail -n 5 "$scratch/chromium-$nb.log" >&2; exit 1; }
    echo "wrote ${out#"$repo"/}/$nb.png"
done
