# Sourced by a device plan at its start (`. "$(dirname "$0")/setup_device.sh"`): the repository root, the
# compiler the packages need there (the preset wrapper builds packages that segfault on load), $OUT / $LOGS / $T0,
# the package and the test tools installed (logs/install.txt).
set -u
cd "$(dirname "$0")/../.."
export CXX=/usr/bin/g++ PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; LOGS=$OUT/logs; mkdir -p "$LOGS"; T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$LOGS/install.txt" 2>&1
python3 -m pip install -q hypothesis pytest-xdist >> "$LOGS/install.txt" 2>&1
# The device's copy of the checkout carries a .git that need not be this tree's HEAD (seen: 8735a19 named while the
# tree was 00051dd), and bench.common.git_commit reads it: pass the tree's commit in the command.
[ -n "${BENCH_GIT_COMMIT:-}" ] || echo "warning: BENCH_GIT_COMMIT not set: the results' git_commit may name a stale commit" >&2
