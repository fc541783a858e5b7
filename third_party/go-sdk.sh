#!/bin/sh
# Re-creates third_party/go-sdk: the go-sdk release below, its non-test
# sources, with go-sdk.patch applied (third_party/README.md says why).
# git apply (not patch, which a minimal machine may lack) applies it.
# --test first runs the release's own tests against the patched sources and
# fuzzes the patched decoding against the released one; --check does that
# and then only compares the result with the committed copy.
set -eu
version=v1.8.0
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd /tmp && go mod download -json "github.com/modelcontextprotocol/go-sdk@$version" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$src" ] || { echo "go-sdk $version not downloaded" >&2; exit 1; }
t=$(mktemp -d)
trap 'chmod -R u+w "$t"; rm -rf "$t"' EXIT

if [ "${1:-}" = --test ] || [ "${1:-}" = --check ]; then
	mkdir "$t/full"
	cp -R "$src/." "$t/full"
	chmod -R u+w "$t/full"
	(cd "$t/full" && git apply "$here/go-sdk.patch" &&
		go test ./internal/json/ ./jsonrpc/ ./mcp/ &&
		go test -run - -fuzz FuzzEquivalent -fuzztime 30s ./internal/json/)
fi

mkdir "$t/copy"
(cd "$src" && find . \( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name go.sum -o -name LICENSE \) \
	! -path './examples/*' ! -path './internal/docs/*' ! -path './internal/readme/*' \
	! -path './internal/oauthtest/*' ! -path './scripts/*' ! -path './design/*' ! -path './docs/*' |
	tar cf - -T -) | (cd "$t/copy" && tar xf -)
chmod -R u+w "$t/copy"
(cd "$t/copy" && git apply "$here/go-sdk.patch")

if [ "${1:-}" = --check ]; then
	diff -r "$t/copy" "$here/go-sdk" || { echo "third_party/go-sdk is not go-sdk $version with go-sdk.patch: run third_party/go-sdk.sh" >&2; exit 1; }
	echo "third_party/go-sdk is go-sdk $version with go-sdk.patch"
	exit 0
fi
rm -rf "$here/go-sdk"
cp -R "$t/copy" "$here/go-sdk"
echo "third_party/go-sdk: go-sdk $version with go-sdk.patch"
