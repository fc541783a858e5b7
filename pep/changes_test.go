package pep_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
	up "github.com/omcp/arap/upstream"
)

// subsPolicy lets everyone read docs://, and only bob private://.
const subsPolicy = `
version: 1
rules:
  - name: read_docs
    match: {action: resources/read, resource_type: mcp_resource}
    when: resource.id.startsWith("docs://")
    effect: allow
  - name: bob_private
    match: {action: resources/read, resource_type: mcp_resource}
    when: resource.id.startsWith("private://") && subject.id == "bob"
    effect: allow
`

const bobToken = "bob-token-0123456"

// subsServer is a real go-sdk upstream that offers resources with
// subscriptions and counts the subscribe and unsubscribe requests it gets.
type subsServer struct {
	srv           *sdk.Server
	url           string
	mu            sync.Mutex
	subscribed    []string // every URI subscribed, in order
	subs, unsubs  atomic.Int64
	currentlySubs map[string]int
}

func startSubs(t *testing.T, stateless bool) *subsServer {
	t.Helper()
	u := &subsServer{currentlySubs: map[string]int{}}
	u.srv = sdk.NewServer(&sdk.Implementation{Name: "ext", Version: "1"}, &sdk.ServerOptions{
		SubscribeHandler: func(_ context.Context, req *sdk.SubscribeRequest) error {
			u.mu.Lock()
			defer u.mu.Unlock()
			u.subs.Add(1)
			u.subscribed = append(u.subscribed, req.Params.URI)
			u.currentlySubs[req.Params.URI]++
			return nil
		},
		UnsubscribeHandler: func(_ context.Context, req *sdk.UnsubscribeRequest) error {
			u.mu.Lock()
			defer u.mu.Unlock()
			u.unsubs.Add(1)
			u.currentlySubs[req.Params.URI]--
			return nil
		},
	})
	read := func(_ context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
		return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{{URI: req.Params.URI, Text: "x"}}}, nil
	}
	for _, uri := range []string{"docs://readme", "private://diary"} {
		u.srv.AddResource(&sdk.Resource{URI: uri, Name: uri}, read)
	}
	u.srv.AddPrompt(&sdk.Prompt{Name: "greet"}, func(context.Context, *sdk.GetPromptRequest) (*sdk.GetPromptResult, error) {
		return &sdk.GetPromptResult{}, nil
	})
	u.srv.AddTool(&sdk.Tool{Name: "first", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{}, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return u.srv }, &sdk.StreamableHTTPOptions{Stateless: stateless})}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	u.url = "http://" + ln.Addr().String() + "/mcp"
	return u
}

// subsPEP is the gateway in front of u, with alice and bob as callers.
func subsPEP(t *testing.T, url string, streams int) *stack {
	t.Helper()
	cfg, err := up.Parse("upstreams.yaml", []byte("upstreams:\n  - name: ext\n    http: {url: "+url+"}\n    prefix: ext_\n    relist: 1h\n"))
	require.NoError(t, err)
	reg := up.New(up.Options{MinBackoff: 50 * time.Millisecond})
	t.Cleanup(func() { _ = reg.Close(context.Background()) })
	require.NoError(t, reg.Reload(context.Background(), cfg))
	require.Eventually(t, func() bool { return reg.Ready()["ext"] == nil }, 30*time.Second, 20*time.Millisecond)
	p := newPEP(t, pepOptions{policy: []byte(subsPolicy), sources: []pep.ToolSource{pep.NewUpstreams(reg, nil)}, upstreams: reg, listenStreams: streams})
	require.NoError(t, p.gate.Callers().Create(context.Background(), "bob-agent", bobToken, pep.Principal{SubjectType: "user", SubjectID: "bob", ActorID: "agent:demo"}))
	return p
}

// listenStream is an open subscriptions/listen stream on the gateway.
type listenStream struct {
	status int
	body   []byte
	events chan map[string]any
	close  context.CancelFunc
}

// listenOn opens a listen stream for token asking for notifications, as a
// 2026-07-28 client that does not declare the tasks extension.
func listenOn(t *testing.T, p *stack, token string, id int, notifications map[string]any) *listenStream {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": tasks.MethodListen, "params": map[string]any{
		"notifications": notifications,
		"_meta":         map[string]any{tasks.MetaProtocolVersion: tasks.ProtocolVersion, tasks.MetaClientCapabilities: map[string]any{}}}})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.url, strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set(tasks.HeaderProtocolVersion, tasks.ProtocolVersion)
	req.Header.Set(tasks.HeaderMethod, tasks.MethodListen)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	s := &listenStream{status: resp.StatusCode, events: make(chan map[string]any, 64), close: cancel}
	if resp.StatusCode != http.StatusOK {
		s.body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		close(s.events)
		return s
	}
	go func() {
		defer close(s.events)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var m map[string]any
				if json.Unmarshal([]byte(d), &m) == nil {
					s.events <- m
				}
			}
		}
	}()
	return s
}

func (s *listenStream) next(t *testing.T) map[string]any {
	t.Helper()
	select {
	case m, ok := <-s.events:
		require.True(t, ok, "the stream ended")
		return m
	case <-time.After(15 * time.Second):
		t.Fatal("no message on the stream")
		return nil
	}
}

// acked reads the acknowledgement and returns what it accepted.
func (s *listenStream) acked(t *testing.T) map[string]any {
	t.Helper()
	require.Equal(t, http.StatusOK, s.status, string(s.body))
	m := s.next(t)
	require.Equal(t, tasks.NotificationAcknowledged, m["method"], m)
	return m["params"].(map[string]any)["notifications"].(map[string]any)
}

// TestListenListChanged: a stream that opts in to list changes, without
// the tasks extension, is acknowledged with what it asked and hears
// notifications/tools/list_changed when an upstream adds a tool (and
// prompts' when one adds a prompt), stamped with its subscription id; a
// stream that asked only for tools does not hear of prompts.
func TestListenListChanged(t *testing.T) {
	t.Parallel()
	u := startSubs(t, true)
	p := subsPEP(t, u.url, 0)

	all := listenOn(t, p, aliceToken, 7, map[string]any{"toolsListChanged": true, "promptsListChanged": true, "resourcesListChanged": true})
	require.Equal(t, map[string]any{"toolsListChanged": true, "promptsListChanged": true, "resourcesListChanged": true}, all.acked(t))
	toolsOnly := listenOn(t, p, aliceToken, 8, map[string]any{"toolsListChanged": true})
	require.Equal(t, map[string]any{"toolsListChanged": true}, toolsOnly.acked(t))

	u.srv.AddPrompt(&sdk.Prompt{Name: "hello"}, func(context.Context, *sdk.GetPromptRequest) (*sdk.GetPromptResult, error) {
		return &sdk.GetPromptResult{}, nil
	})
	m := all.next(t)
	require.Equal(t, tasks.NotificationPromptsListChanged, m["method"], m)
	require.Equal(t, float64(7), m["params"].(map[string]any)["_meta"].(map[string]any)[tasks.MetaSubscriptionID])

	u.srv.AddTool(&sdk.Tool{Name: "added", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{}, nil
	})
	m = all.next(t)
	require.Equal(t, tasks.NotificationToolsListChanged, m["method"], m)
	m = toolsOnly.next(t)
	require.Equal(t, tasks.NotificationToolsListChanged, m["method"], "the prompt change was not sent to a stream that did not ask: %v", m)
	require.Equal(t, float64(8), m["params"].(map[string]any)["_meta"].(map[string]any)[tasks.MetaSubscriptionID])
	res, rerr := rpc(t, p, "tools/list", "", nil)
	require.Nil(t, rerr)
	require.Contains(t, string(res), `"ext_added"`, "the change is offered when told")

	// The upstream re-registers the same tool and announces a change; the
	// gateway's list comes out the same, and its streams are told anyway,
	// as the upstream's own would be (the conformance trigger tools work
	// so).
	u.srv.AddTool(&sdk.Tool{Name: "added", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{}, nil
	})
	m = toolsOnly.next(t)
	require.Equal(t, tasks.NotificationToolsListChanged, m["method"], m)

	res, rerr = rpc(t, p, "server/discover", "", nil)
	require.Nil(t, rerr)
	var disc struct {
		Capabilities struct {
			Tools     map[string]any `json:"tools"`
			Resources map[string]any `json:"resources"`
		} `json:"capabilities"`
	}
	require.NoError(t, json.Unmarshal(res, &disc))
	require.Equal(t, true, disc.Capabilities.Tools["listChanged"], string(res))
	require.Equal(t, true, disc.Capabilities.Resources["subscribe"], "an upstream offers subscriptions: %s", res)
}

// TestListenNoSubscribeAdvertised: without an upstream that takes
// subscriptions, resources.subscribe is not advertised, and a URI is not
// acknowledged.
func TestListenNoSubscribeAdvertised(t *testing.T) {
	t.Parallel()
	ext := startOffering(t) // resources, no subscriptions
	p := passPEP(t, ext.url, passPolicy)
	res, rerr := rpc(t, p, "server/discover", "", nil)
	require.Nil(t, rerr)
	var disc struct {
		Capabilities struct {
			Resources map[string]any `json:"resources"`
		} `json:"capabilities"`
	}
	require.NoError(t, json.Unmarshal(res, &disc))
	require.NotNil(t, disc.Capabilities.Resources, string(res))
	require.NotContains(t, disc.Capabilities.Resources, "subscribe", string(res))

	// docs://readme is offered and alice may read it, but its upstream
	// takes no subscriptions: not acknowledged, and with nothing to carry
	// the stream ends with its result.
	s := listenOn(t, p, aliceToken, 4, map[string]any{"resourceSubscriptions": []string{"docs://readme"}})
	require.Empty(t, s.acked(t))
	m := s.next(t)
	require.Equal(t, float64(4), m["id"], m)
	require.Contains(t, m, "result")
}

// TestListenResourceSubscriptions: only the URIs the PDP lets the caller
// read (and an upstream offers) are acknowledged and subscribed upstream;
// an update reaches exactly the streams subscribed to its URI, and never a
// caller denied it.
func TestListenResourceSubscriptions(t *testing.T) {
	t.Parallel()
	u := startSubs(t, true)
	p := subsPEP(t, u.url, 0)

	alice := listenOn(t, p, aliceToken, 1, map[string]any{"resourceSubscriptions": []string{"docs://readme", "private://diary", "nothing://here"}, "toolsListChanged": true})
	require.Equal(t, map[string]any{"resourceSubscriptions": []any{"docs://readme"}, "toolsListChanged": true}, alice.acked(t),
		"private:// is denied to alice, nothing:// is offered by no upstream")
	bob := listenOn(t, p, bobToken, 2, map[string]any{"resourceSubscriptions": []string{"private://diary"}})
	require.Equal(t, map[string]any{"resourceSubscriptions": []any{"private://diary"}}, bob.acked(t))
	u.mu.Lock()
	require.ElementsMatch(t, []string{"docs://readme", "private://diary"}, u.subscribed, "the upstream was asked for what was acknowledged, once each")
	u.mu.Unlock()

	require.NoError(t, u.srv.ResourceUpdated(context.Background(), &sdk.ResourceUpdatedNotificationParams{URI: "private://diary"}))
	m := bob.next(t)
	require.Equal(t, tasks.NotificationResourceUpdated, m["method"], m)
	require.Equal(t, "private://diary", m["params"].(map[string]any)["uri"])
	require.Equal(t, float64(2), m["params"].(map[string]any)["_meta"].(map[string]any)[tasks.MetaSubscriptionID])
	// Whatever the private update did to alice's stream, it did before bob
	// had it: a tool change after it is the next thing alice hears.
	u.srv.AddTool(&sdk.Tool{Name: "later", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{}, nil
	})
	m = alice.next(t)
	require.Equal(t, tasks.NotificationToolsListChanged, m["method"], "alice hears nothing of private://diary: %v", m)

	require.NoError(t, u.srv.ResourceUpdated(context.Background(), &sdk.ResourceUpdatedNotificationParams{URI: "docs://readme"}))
	m = alice.next(t)
	require.Equal(t, tasks.NotificationResourceUpdated, m["method"], m)
	require.Equal(t, "docs://readme", m["params"].(map[string]any)["uri"])
	select {
	case m := <-bob.events:
		t.Fatalf("bob is not subscribed to docs://readme: %v", m)
	default:
	}
}

// TestListenUpstreamRefCounted: the upstream is subscribed once while any
// stream wants a URI, and unsubscribed when the last one closes (a
// 2025-11-25 upstream session: subscribe and unsubscribe are requests).
func TestListenUpstreamRefCounted(t *testing.T) {
	t.Parallel()
	u := startSubs(t, false)
	p := subsPEP(t, u.url, 2)
	want := map[string]any{"resourceSubscriptions": []string{"docs://readme"}}

	s1 := listenOn(t, p, aliceToken, 1, want)
	s1.acked(t)
	s2 := listenOn(t, p, aliceToken, 2, want)
	s2.acked(t)
	require.Equal(t, int64(1), u.subs.Load(), "one upstream subscription for both streams")

	s1.close()
	// The third stream fits under the cap of two once the first has
	// ended, and ending it dropped its subscriptions first.
	var s3 *listenStream
	require.Eventually(t, func() bool {
		s3 = listenOn(t, p, aliceToken, 3, map[string]any{"toolsListChanged": true})
		return s3.status == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)
	s3.acked(t)
	require.Equal(t, int64(0), u.unsubs.Load(), "another stream still wants the URI")
	require.NoError(t, u.srv.ResourceUpdated(context.Background(), &sdk.ResourceUpdatedNotificationParams{URI: "docs://readme"}))
	require.Equal(t, "docs://readme", s2.next(t)["params"].(map[string]any)["uri"])

	s2.close()
	require.Eventually(t, func() bool { return u.unsubs.Load() == 1 }, 10*time.Second, 10*time.Millisecond, "the last stream gone: unsubscribed upstream")
	require.Equal(t, int64(1), u.subs.Load())
}

// TestListenBadOptIns: opt-ins of the wrong type, and too many URIs, are
// refused with -32602 and open no stream; task ids without the tasks
// extension with -32021.
func TestListenBadOptIns(t *testing.T) {
	t.Parallel()
	u := startSubs(t, true)
	p := subsPEP(t, u.url, 0)
	many := make([]string, tasks.MaxListenURIs+1)
	for i := range many {
		many[i] = "docs://page/" + strings.Repeat("x", i+1)
	}
	for _, n := range []map[string]any{
		{"toolsListChanged": "yes"},
		{"resourceSubscriptions": "docs://readme"},
		{"resourceSubscriptions": []any{""}},
		{"resourceSubscriptions": many},
	} {
		s := listenOn(t, p, aliceToken, 1, n)
		require.Equal(t, http.StatusBadRequest, s.status, "%v", n)
		require.Contains(t, string(s.body), "-32602", "%v", n)
	}
	require.Equal(t, int64(0), u.subs.Load())

	// Task ids still need the tasks extension, with other opt-ins or not.
	s := listenOn(t, p, aliceToken, 1, map[string]any{"taskIds": []string{"tsk_x"}, "toolsListChanged": true})
	require.Equal(t, http.StatusBadRequest, s.status)
	require.Contains(t, string(s.body), "-32021", string(s.body))
}

type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// TestListenGoSDKClient: the go-sdk's own 2026-07-28 client, talking to the
// gateway, hears of a tool added upstream (it opens its listen stream
// because discover advertises tools.listChanged) and of an update to a
// resource it subscribed to with ClientSession.Subscribe.
func TestListenGoSDKClient(t *testing.T) {
	t.Parallel()
	u := startSubs(t, true)
	p := subsPEP(t, u.url, 0)
	ctx := context.Background()
	changed := make(chan struct{}, 10)
	updated := make(chan string, 10)
	c := sdk.NewClient(&sdk.Implementation{Name: "client", Version: "1"}, &sdk.ClientOptions{
		ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) { changed <- struct{}{} },
		ResourceUpdatedHandler: func(_ context.Context, r *sdk.ResourceUpdatedNotificationRequest) { updated <- r.Params.URI },
	})
	sess, err := c.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: p.url, HTTPClient: &http.Client{Transport: bearer(aliceToken)}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close() })
	require.Equal(t, tasks.ProtocolVersion, sess.InitializeResult().ProtocolVersion)

	require.NoError(t, sess.Subscribe(ctx, &sdk.SubscribeParams{URI: "docs://readme"}))
	require.Eventually(t, func() bool { return u.subs.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, u.srv.ResourceUpdated(ctx, &sdk.ResourceUpdatedNotificationParams{URI: "docs://readme"}))
	select {
	case uri := <-updated:
		require.Equal(t, "docs://readme", uri)
	case <-time.After(15 * time.Second):
		t.Fatal("no resources/updated")
	}

	u.srv.AddTool(&sdk.Tool{Name: "added", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{}, nil
	})
	select {
	case <-changed:
	case <-time.After(15 * time.Second):
		t.Fatal("no tools/list_changed")
	}

	require.NoError(t, sess.Unsubscribe(ctx, &sdk.UnsubscribeParams{URI: "docs://readme"}))
	require.Eventually(t, func() bool { return u.unsubs.Load() == 1 }, 10*time.Second, 10*time.Millisecond, "the client's unsubscribe ends its stream, and the gateway's upstream subscription")
}
