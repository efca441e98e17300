#!/usr/bin/env bash
# Prints the integration and e2e test modules that differ from BASE (default: main, else
# origin/main): changed or added on this branch since it left BASE, changed in the work tree, or new
# and not yet committed. `make check` runs them after the unit tests.
#
#   scripts/changed-tests.sh [BASE]
set -euo pipefail
cd "$(dirname "$0")/.."

base=${1:-}
if [ -z "$base" ]; then
    for candidate in main origin/main; do
        git rev-parse --verify --quiet "$candidate^{commit}" >/dev/null && { base=$candidate; break; }
    done
    [ -n "$base" ] || { echo "changed-tests.sh: no main or origin/main to compare with; give BASE=<ref>" >&2; exit 2; }
fi
git rev-parse --verify --quiet "$base^{commit}" >/dev/null \
    || { echo "changed-tests.sh: $base is not a commit of this repository" >&2; exit 2; }
fork=$(git merge-base "$base" HEAD) || { echo "changed-tests.sh: $base has no commit in common with HEAD" >&2; exit 2; }

{ git diff --name-only "$fork"; git ls-files --others --exclude-standard; } \
    | { grep -E '^tests/(integration|e2e)/test_[^/]*\.py$' || true; } | sort -u | while read -r module; do
        if [ -f "$module" ]; then echo "$module"; fi  # a deleted module is not run
    done
