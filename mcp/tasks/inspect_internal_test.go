package tasks

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"testing"
)

// inspectReference is inspect as it was on encoding/json's Token, which
// FuzzInspectAgrees holds the faster one to.
func inspectReference(body []byte) *parseError {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	type frame struct {
		object   bool
		path     string // "-" once off the read path
		keys     map[string]struct{}
		key      string // the member whose value comes next
		wantsKey bool
	}
	var stack []*frame
	child := func(parent *frame) string {
		switch {
		case parent == nil:
			return "" // the message, or a batch of them
		case !parent.object && len(stack) == 1:
			return "" // an element of a batch is a message
		case !parent.object:
			return "-"
		case parent.path == "":
			return parent.key
		case parent.path == "params":
			return "params." + parent.key
		}
		return "-"
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			if len(stack) == 0 {
				return &parseError{code: CodeParseError, msg: "empty request body"}
			}
			return &parseError{code: CodeParseError, msg: "malformed JSON"}
		}
		if err != nil {
			return &parseError{code: CodeParseError, msg: "malformed JSON: " + err.Error()}
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.wantsKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
			} else {
				key := tok.(string)
				if _, dup := top.keys[key]; dup {
					return &parseError{code: CodeInvalidRequest, msg: "duplicate member " + quote(key) + " in a JSON object"}
				}
				for _, name := range readNames[top.path] {
					if key != name && strings.EqualFold(key, name) {
						return &parseError{code: CodeInvalidRequest, msg: "member " + quote(key) + " is a case variant of " + strconv.Quote(name)}
					}
				}
				top.keys[key] = struct{}{}
				top.key, top.wantsKey = key, false
				continue
			}
		} else if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				f := &frame{object: d == '{', path: child(top), wantsKey: d == '{'}
				if f.object {
					f.keys = map[string]struct{}{}
				}
				stack = append(stack, f)
				continue
			case ']':
				stack = stack[:len(stack)-1]
			}
		} else if top != nil && top.object {
			top.wantsKey = true // a scalar value ends the member
			continue
		}
		// A value (object, array or scalar) has just ended.
		if len(stack) > 0 {
			if p := stack[len(stack)-1]; p.object {
				p.wantsKey = true
			}
			continue
		}
		if _, err := dec.Token(); err != io.EOF {
			return &parseError{code: CodeParseError, msg: "malformed JSON: data after the request"}
		}
		return nil
	}
}

// FuzzInspectAgrees: inspect refuses exactly what the encoding/json version
// refused, with the same code, and the same message but for the parser's
// own words about malformed JSON.
func FuzzInspectAgrees(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"tsk_A","_meta":{"k":[1,{"a":null}]}}}`,
		`{"method":"a","Method":"b"}`, `{"params":{"taskId":1,"TASKID":2}}`, `{"params":{"notifications":{"taskIds":[],"TaskIds":[]}}}`,
		`{"a":1,"a":2}`, `{"a":{"b":1,"b":2}}`, `[{"id":1},{"Id":2}]`, `[[{"Id":2}]]`, `{"x":{"Method":1}}`,
		`{"task\u0049d":1,"taskId":2}`, `{"a":"ÿ","aÿ":1,"aþ":2}`, `{} x`, `{}{}`, ` `, ``, `{`, `[1,]`, `"s"`, `12`,
		`{"params":{"_META":1}}`, `{"params":[{"taskid":1}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, want := inspect(body), inspectReference(body)
		if (got == nil) != (want == nil) {
			t.Fatalf("%q: inspect %v, the encoding/json version %v", body, got, want)
		}
		if got == nil {
			return
		}
		if got.code != want.code {
			t.Fatalf("%q: code %d (%s), want %d (%s)", body, got.code, got.msg, want.code, want.msg)
		}
		if got.code != CodeParseError && got.msg != want.msg {
			t.Fatalf("%q: %q, want %q", body, got.msg, want.msg)
		}
	})
}

// TestInspectManyMembers: past the first few, an object's member names are
// kept in a map (a list scanned per name is quadratic in a 1 MB body), and
// a duplicate is found on either side of the switch.
func TestInspectManyMembers(t *testing.T) {
	object := func(n int, extra ...string) []byte {
		var b strings.Builder
		b.WriteString(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"m` + strconv.Itoa(i) + `":0`)
		}
		for _, e := range extra {
			b.WriteString(`,"` + e + `":0`)
		}
		b.WriteString(`}}}`)
		return []byte(b.String())
	}
	if err := inspect(object(60000)); err != nil {
		t.Fatalf("60,000 distinct members refused: %s", err.msg)
	}
	for _, c := range []struct {
		n   int
		dup string
	}{{5, "m3"}, {16, "m3"}, {17, "m3"}, {17, "m16"}, {200, "m3"}, {200, "m150"}} {
		err := inspect(object(c.n, c.dup))
		if err == nil || err.code != CodeInvalidRequest || !strings.Contains(err.msg, "duplicate member") {
			t.Fatalf("%d members and %s again: %v", c.n, c.dup, err)
		}
	}
}

func BenchmarkInspect(b *testing.B) {
	body := []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"up_test_simple_text","arguments":{"to":"acct-1","amount":50000,"memo":"rent for december"},"_meta":{"io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}},"progressToken":"p1"}}}`)
	b.Run("jsontext", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if inspect(body) != nil {
				b.Fatal("refused")
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if inspectReference(body) != nil {
				b.Fatal("refused")
			}
		}
	})
}
