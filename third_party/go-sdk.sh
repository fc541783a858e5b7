#!/bin/sh
# Re-creates third_party/go-sdk: the go-sdk release below, its non-test
# sources, with go-sdk.patch applied (third_party/README.md says why) by
# git apply (patch is not on every machine).
#   (no argument)  re-create the copy
#   --test         first run the release's tests on the patched sources and
#                  fuzz the patched decodings against the released ones
#   --check        --test, then compare with the committed copy (.ci/run)
set -eu
version=v1.8.0
sum=h1:KIvahhYqwtbeniWVPs3TcXEA7b8jEtwfBpOTAI+Urx4= # go.sum's line before the replace
mode=${1:-}
case $mode in "" | --test | --check) ;; *) echo "usage: $0 [--test | --check]" >&2; exit 2 ;; esac
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
t=$(mktemp -d)
trap 'chmod -R u+w "$t"; rm -rf "$t"' EXIT
trap 'exit 1' INT TERM

# The sum pinned above is the check (go.sum no longer holds it), so the
# download does not need the checksum database to be reachable.
info=$(cd "$t" && GONOSUMDB=github.com/modelcontextprotocol/go-sdk go mod download -json "github.com/modelcontextprotocol/go-sdk@$version")
src=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
got=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p')
[ -d "$src" ] || { echo "go-sdk $version was not downloaded" >&2; exit 1; }
[ "$got" = "$sum" ] || { echo "go-sdk $version: sum $got, want $sum" >&2; exit 1; }

# The release's tests that fail on the release itself, unpatched, when the
# machine is busy: they are skipped, since they say nothing of the patch.
#   TestStreamableStateful_DiscoverDoesNotLeakSession counts the server's
#   sessions without waiting for the server to drop a closed one (unpatched
#   v1.8.0, -count=200: 1 failure idle, 10 with both cores busy).
#   TestStdioContextCancellation gives a child process 5 s to exit after
#   SIGINT and sends it no message, so the decoding is not on its path
#   (failed once in 8 runs of the package with both cores busy).
#   TestStreamableSessionTimeout gives a stateful session 50 ms between
#   the client's connect and its next request (unpatched v1.8.0,
#   -count=200 at load 6 to 12: 2 failures; once in a run of the package
#   at load 35).
flaky='^(TestStreamableStateful_DiscoverDoesNotLeakSession|TestStdioContextCancellation|TestStreamableSessionTimeout)$'

if [ -n "$mode" ]; then
	mkdir "$t/full"
	cp -R "$src/." "$t/full"
	chmod -R u+w "$t/full"
	(cd "$t/full" && git apply "$here/go-sdk.patch" &&
		go test -skip "$flaky" ./internal/json/ ./jsonrpc/ ./mcp/ &&
		go test -run - -fuzz FuzzEquivalent -fuzztime 30s ./internal/json/ &&
		go test -run - -fuzz FuzzRequestDecodingEquivalent -fuzztime 30s ./mcp/)
fi

mkdir "$t/copy"
(cd "$src" && find . \( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name go.sum -o -name LICENSE \) \
	! -path './examples/*' ! -path './internal/docs/*' ! -path './internal/readme/*' \
	! -path './internal/oauthtest/*' ! -path './scripts/*' ! -path './design/*' ! -path './docs/*' |
	tar cf - -T -) | (cd "$t/copy" && tar xf -)
chmod -R u+w "$t/copy"
(cd "$t/copy" && git apply "$here/go-sdk.patch")

if [ "$mode" = --check ]; then
	diff -r "$t/copy" "$here/go-sdk" || { echo "third_party/go-sdk is not go-sdk $version with go-sdk.patch: run third_party/go-sdk.sh" >&2; exit 1; }
	echo "third_party/go-sdk is go-sdk $version with go-sdk.patch"
	exit 0
fi
rm -rf "$here/go-sdk"
cp -R "$t/copy" "$here/go-sdk"
echo "third_party/go-sdk: go-sdk $version with go-sdk.patch"
