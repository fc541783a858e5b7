#!/usr/bin/env bash
# Builds the arap image (Dockerfile at the repository root) around static
# binaries built here: nothing is pulled, so it works without a registry.
#
#   deploy/image.sh [TAG]     default TAG arap:<version>
#
# VERSION (default: git describe) is stamped into the binaries;
# CONTAINER_ENGINE picks podman (default) or docker; CA_CERTS the CA bundle
# to copy in (default: Debian's /etc/ssl/certs/ca-certificates.crt).
set -euo pipefail
cd "$(dirname "$0")/.."
version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
tag=${1:-arap:$version}
engine=${CONTAINER_ENGINE:-podman}
ca=${CA_CERTS:-/etc/ssl/certs/ca-certificates.crt}
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
# CGO off: a static binary, which FROM scratch needs (no libc in the image).
# -trimpath drops the VCS stamp's source, so the version and revision go in
# by -X (internal/version).
revision=${REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
pkg=github.com/omcp/arap/internal/version
CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X $pkg.version=$version -X $pkg.revision=$revision" \
  -o "$ctx/" ./cmd/arapd ./cmd/arapctl
cp "$ca" "$ctx/ca-certificates.crt"
"$engine" build -f Dockerfile -t "$tag" "$ctx"
echo "built $tag"
