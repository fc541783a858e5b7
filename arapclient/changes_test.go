package arapclient_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
)

// TestChangesEndsWhenSilent: a change stream that says nothing for three
// of its keepalives (a connection lost without a word) ends with
// ErrStreamSilent, after passing on what it said; the client's own timeout
// does not cut a stream short.
func TestChangesEndsWhenSilent(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, authzen.PathDecisionChanges, r.URL.Path)
		require.Equal(t, "Bearer tok", r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: hello\ndata: {\"epoch\":7,\"keepalive\":0.1,\"settle\":1.5}\n\n")
		for range 5 { // alive for a while: keepalives, then a change
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
			_, _ = io.WriteString(w, ":\n\n")
		}
		_, _ = io.WriteString(w, "event: change\ndata: {\"epoch\":8,\"kind\":\"policy\"}\n\n")
		w.(http.Flusher).Flush()
		select { // then silent
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	c := &arapclient.Client{BaseURL: srv.URL, Token: "tok", HTTP: &http.Client{Timeout: 100 * time.Millisecond}}
	var got []arapclient.Change
	ended := make(chan error, 1)
	go func() { ended <- c.Changes(context.Background(), func(ch arapclient.Change) { got = append(got, ch) }) }()
	var err error
	select {
	case err = <-ended:
	case <-time.After(time.Minute): // three keepalives are 0.3 s
		t.Fatal("a silent stream was followed for a minute")
	}
	require.True(t, errors.Is(err, arapclient.ErrStreamSilent), "%v", err)
	require.Equal(t, []arapclient.Change{
		{Hello: true, Epoch: 7, Keepalive: 100 * time.Millisecond, Settle: 1500 * time.Millisecond},
		{Epoch: 8, Kind: "policy"},
	}, got)
}
