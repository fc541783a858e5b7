# The arapd and arapctl image: two static binaries, the CA certificates
# (OIDC, Slack and SMTP need TLS) and nothing else: no shell, no package
# manager, no /etc/passwd. Built FROM scratch around binaries built on the
# host, so nothing is pulled from a registry. deploy/image.sh prepares the
# build context and builds it:
#
#   deploy/image.sh arap:dev            # podman, or CONTAINER_ENGINE=docker
#
# or by hand, with a context directory holding arapd, arapctl and
# ca-certificates.crt:
#
#   CGO_ENABLED=0 go build -trimpath -o ctx/ ./cmd/arapd ./cmd/arapctl
#   cp /etc/ssl/certs/ca-certificates.crt ctx/
#   podman build -f Dockerfile -t arap ctx
FROM scratch
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY arapd arapctl /usr/local/bin/
# Non-root by number: there is no /etc/passwd to name a user in. 65532 is
# the conventional "nonroot" id of distroless images.
USER 65532:65532
# In a container the listeners must bind all interfaces (the binaries'
# defaults are loopback).
ENV PATH=/usr/local/bin \
    ARAP_ADDR=0.0.0.0:8480 \
    ARAP_MCP_ADDR=0.0.0.0:8481
EXPOSE 8480 8481
ENTRYPOINT ["/usr/local/bin/arapd"]
CMD ["serve"]
