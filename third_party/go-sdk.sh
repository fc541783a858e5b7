#!/bin/sh
# Re-creates third_party/go-sdk: the go-sdk release below, its non-test
# sources, with go-sdk.patch applied (third_party/README.md says why).
# --test first runs the release's own tests against the patched sources.
set -eu
version=v1.8.0
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd /tmp && go mod download -json "github.com/modelcontextprotocol/go-sdk@$version" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$src" ] || { echo "go-sdk $version not downloaded" >&2; exit 1; }

if [ "${1:-}" = --test ]; then
	t=$(mktemp -d)
	trap 'chmod -R u+w "$t"; rm -rf "$t"' EXIT
	cp -R "$src/." "$t"
	chmod -R u+w "$t"
	(cd "$t" && patch -s -p1 <"$here/go-sdk.patch" && go test ./internal/json/ ./jsonrpc/ ./mcp/ && go test -run - -fuzz FuzzEquivalent -fuzztime 30s ./internal/json/)
fi

rm -rf "$here/go-sdk"
mkdir "$here/go-sdk"
(cd "$src" && find . \( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name go.sum -o -name LICENSE \) \
	! -path './examples/*' ! -path './internal/docs/*' ! -path './internal/readme/*' \
	! -path './internal/oauthtest/*' ! -path './scripts/*' ! -path './design/*' ! -path './docs/*' |
	tar cf - -T -) | (cd "$here/go-sdk" && tar xf -)
chmod -R u+w "$here/go-sdk"
(cd "$here/go-sdk" && patch -s -p1 <"$here/go-sdk.patch")
echo "third_party/go-sdk: go-sdk $version with go-sdk.patch"
