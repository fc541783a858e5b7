package pep

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// TestUpstreamErrorKind: each failure of an upstream request falls in one
// bounded kind, whatever wraps it.
func TestUpstreamErrorKind(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	conn, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now()))
	_, timeout := conn.Read(make([]byte, 1)) // a net.Error that times out, not a context's
	require.Error(t, timeout)
	require.NoError(t, conn.Close())
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	_, refused := net.Dial("tcp", addr)
	require.Error(t, refused)
	for err, kind := range map[error]string{
		fmt.Errorf("call: %w", context.DeadlineExceeded): UpstreamTimeout,
		timeout:                                  UpstreamTimeout,
		fmt.Errorf("call: %w", context.Canceled): UpstreamCanceled,
		fmt.Errorf("call: %w", &jsonrpc.Error{Code: -32602, Message: "x"}): UpstreamRPC,
		fmt.Errorf("call: %w", refused):                                    UpstreamConnection,
		fmt.Errorf("call: %w", sdk.ErrConnectionClosed):                    UpstreamConnection,
		errors.New("something else"):                                       UpstreamOther,
	} {
		require.Equal(t, kind, upstreamErrorKind(err), "%v", err)
	}
}
