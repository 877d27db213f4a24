#!/bin/sh
# Prints, for each common call, the library files that ran during it.
# Usage (from the repository root): sh internal/callpath/run.sh
set -e
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go build -o "$dir/callpath" -cover -covermode=atomic \
	-coverpkg=github.com/funnelguard/funnelguard/mutex,github.com/funnelguard/funnelguard/funnel,github.com/funnelguard/funnelguard/internal/ctxcall,github.com/funnelguard/funnelguard/internal/keyspace,github.com/funnelguard/funnelguard/internal/reach,github.com/funnelguard/funnelguard/internal/outage,github.com/funnelguard/funnelguard/internal/nilcheck,github.com/funnelguard/funnelguard/internal/forgetful,github.com/funnelguard/funnelguard/internal/callpath \
	./internal/callpath
mkdir "$dir/out"
GOCOVERDIR="$dir" "$dir/callpath" "$dir/out"
for c in "$dir"/out/*/; do
	name=$(basename "$c")
	go tool covdata textfmt -i="$c" -o="$dir/$name.txt"
	files=$(awk 'NR > 1 { n = split($0, f, " "); if (f[n] > 0) { split(f[1], p, ":"); sub("github.com/funnelguard/funnelguard/", "", p[1]); if (p[1] !~ /callpath/) print p[1] } }' "$dir/$name.txt" | sort -u)
	echo "$name: $(echo "$files" | wc -l) files"
	echo "$files" | sed 's/^/  /'
done
