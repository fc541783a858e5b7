package mcp

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	internaljson "github.com/modelcontextprotocol/go-sdk/internal/json"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// The released decoding of a request's `_meta` (third_party/README.md in
// arap), kept to compare with.

func oldExtractRequestMeta(rawParams json.RawMessage) Meta {
	if len(rawParams) == 0 {
		return nil
	}
	var meta struct {
		Meta Meta `json:"_meta"`
	}
	if err := internaljson.Unmarshal(rawParams, &meta); err != nil {
		return nil
	}
	return meta.Meta
}

func oldMetaProtocolVersion(rawParams json.RawMessage) string {
	v, _ := oldExtractRequestMeta(rawParams)[MetaKeyProtocolVersion].(string)
	return v
}

func oldValidateRequestMeta(req *jsonrpc.Request) (*validatedMeta, error) {
	if !req.IsCall() {
		return &validatedMeta{}, nil
	}
	meta := oldExtractRequestMeta(req.Params)
	if meta == nil {
		return &validatedMeta{}, nil
	}
	protocolVersion, ok := meta[MetaKeyProtocolVersion].(string)
	if !ok || protocolVersion < protocolVersion20260728 {
		return &validatedMeta{}, nil
	}
	var clientInfo *Implementation
	if _, present := meta[MetaKeyClientInfo]; present {
		var ok bool
		clientInfo, ok = decodeMetaValue[*Implementation](meta, MetaKeyClientInfo)
		if !ok {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("invalid _meta field %q", MetaKeyClientInfo)}
		}
	}
	capabilities, ok := decodeMetaValue[*clientCapabilitiesV2](meta, MetaKeyClientCapabilities)
	if !ok {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("missing or invalid _meta field %q", MetaKeyClientCapabilities)}
	}
	logLevel, _ := decodeMetaValue[LoggingLevel](meta, MetaKeyLogLevel)
	return &validatedMeta{usesNewProtocol: true, initializeParams: &InitializeParams{
		ProtocolVersion: protocolVersion,
		Capabilities:    capabilities.toV1(),
		ClientInfo:      clientInfo,
	}, logLevel: logLevel}, nil
}

func oldExtractToolName(params json.RawMessage) (string, bool) {
	var p CallToolParams
	if err := internaljson.Unmarshal(params, &p); err == nil {
		return p.Name, true
	}
	return "", false
}

// unrepresentable finds a number no float64 holds (1e400), which the
// released decoding refused wherever it stood in `_meta` or the arguments,
// including members it did not read; the patched one does not decode
// those members and reads the params as if the number were any other.
var unrepresentable = regexp.MustCompile(`-?[0-9]+(\.[0-9]+)?[eE][+-]?[0-9]+|[0-9]{300,}`)

func representable(data []byte) bool {
	for _, n := range unrepresentable.FindAll(data, -1) {
		if _, err := strconv.ParseFloat(string(n), 64); err != nil {
			return false
		}
	}
	return true
}

// FuzzRequestDecodingEquivalent: what the stateless server reads of a
// request's params (its `_meta` protocol version, the per-request
// initialize params, a tool call's name) is what the released decoding
// read, errors included, but for a number no float64 holds (above).
func FuzzRequestDecodingEquivalent(f *testing.F) {
	for _, s := range []string{
		`{"name":"echo","arguments":{"to":"a","amount":5},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}},"io.modelcontextprotocol/clientInfo":{"name":"c","version":"1"}}}`,
		`{"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":null}}`,
		`{"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities": null , "io.modelcontextprotocol/logLevel":"debug"}}`,
		`{"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"roots":{"listChanged":true}},"io.modelcontextprotocol/logLevel":5}}`,
		`{"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":[],"io.modelcontextprotocol/clientInfo":"c"}}`,
		`{"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":2026,"io.modelcontextprotocol\/clientCapabilities":{}}}`,
		`{"name":"x","_meta":{"io.modelcontextprotocol\/protocolVersion":"2026-07-28","IO.modelcontextprotocol/clientCapabilities":{}}}`,
		`{"name":"x","_meta":null}`, `{"name":"x","_meta":5}`, `{"name":"x","_meta":"m"}`, `{"name":"x","_meta":[]}`, `{"name":5}`, `{"name":null}`,
		`{"name":"x","arguments":[1,"a",{"b":null}],"inputResponses":{"r":{"action":"accept"}},"requestState":"s"}`,
		`{"name":"x","inputResponses":5}`, `{"name":"x","requestState":5}`, `{"name":"x","_meta":{"a":1e400}}`, `{"name":"x","arguments":{"n":1e400}}`,
		`[]`, `null`, `5`, `{}`, ``, `{"name":"x"} trailing`, `{"name":"a","name":"b","_meta":{},"_meta":null}`,
	} {
		f.Add([]byte(s))
	}
	id, err := jsonrpc.MakeID("test")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, params []byte) {
		if !representable(params) {
			return
		}
		raw := json.RawMessage(params)
		if a, b := oldMetaProtocolVersion(raw), metaProtocolVersion(raw); a != b {
			t.Fatalf("%s: protocol version %q, released %q", params, b, a)
		}
		req := &jsonrpc.Request{Method: methodCallTool, Params: raw, ID: id}
		ov, oerr := oldValidateRequestMeta(req)
		nv, nerr := validateRequestMeta(req)
		if fmt.Sprint(oerr) != fmt.Sprint(nerr) {
			t.Fatalf("%s: error %v, released %v", params, nerr, oerr)
		}
		if oerr == nil && (ov.usesNewProtocol != nv.usesNewProtocol || ov.logLevel != nv.logLevel || !reflect.DeepEqual(ov.initializeParams, nv.initializeParams)) {
			t.Fatalf("%s: %+v %+v, released %+v %+v", params, nv, nv.initializeParams, ov, ov.initializeParams)
		}
		on, ook := oldExtractToolName(raw)
		nn, nok := extractName(methodCallTool, raw)
		if on != nn || ook != nok {
			t.Fatalf("%s: name %q %v, released %q %v", params, nn, nok, on, ook)
		}
	})
}

// TestToolParamHeadersFoundOnce: a server tool's x-mcp-header bindings are
// what extractParamHeaderAnnotations finds in its input schema (in the
// order of a map's range, hence sorted here).
func TestToolParamHeadersFoundOnce(t *testing.T) {
	tool := &Tool{Name: "t", InputSchema: map[string]any{"type": "object", "properties": map[string]any{
		"region": map[string]any{"type": "string", "x-mcp-header": "Region"},
		"nested": map[string]any{"type": "object", "properties": map[string]any{"id": map[string]any{"type": "integer", "x-mcp-header": "Id"}}},
	}}}
	st := &serverTool{tool: tool}
	want := extractParamHeaderAnnotations(tool)
	if len(want) != 2 {
		t.Fatalf("bindings %+v, want 2", want)
	}
	byHeader := func(bs []paramHeaderBinding) []paramHeaderBinding {
		bs = slices.Clone(bs)
		slices.SortFunc(bs, func(a, b paramHeaderBinding) int { return strings.Compare(a.Header, b.Header) })
		return bs
	}
	for range 2 {
		if got := st.paramHeaders(); !reflect.DeepEqual(byHeader(got), byHeader(want)) {
			t.Fatalf("paramHeaders() = %+v, want %+v", got, want)
		}
	}
}
