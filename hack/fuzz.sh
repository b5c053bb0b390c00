#!/usr/bin/env bash
# Runs every Fuzz* function in the module for FUZZTIME each (default 10s).
# The seed corpora also run as plain tests in `go test ./...`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
t=${FUZZTIME:-10s}
found=0
while IFS=: read -r file fn; do
  pkg=./$(dirname "$file")
  echo "== fuzz $pkg $fn ($t)"
  go test -run='^$' -fuzz="^${fn}\$" -fuzztime="$t" "$pkg"
  found=1
done < <(grep -rEo --include='*_test.go' '^func (Fuzz[A-Za-z0-9_]+)' cmd internal test 2>/dev/null \
          | sed -E 's/func //' | sort -u)
[ $found = 1 ] || echo "no fuzz targets found"
