package json

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
	"time"

	sj "github.com/segmentio/encoding/json"
)

// oldUnmarshal is Unmarshal as released, through a Decoder.
func oldUnmarshal(data []byte, v any) error {
	if err := checkMaxDepth(data, defaultMaxDepth); err != nil {
		return err
	}
	return NewDecoder(bytes.NewReader(data)).Decode(v)
}

type params struct {
	Meta      map[string]any `json:"_meta,omitempty"`
	Name      string         `json:"name"`
	Arguments sj.RawMessage  `json:"arguments,omitempty"`
	N         *int           `json:"n"`
}

// FuzzEquivalent: the patched Unmarshal (third_party/README.md in arap)
// decodes and fails as the released one did, but for a number at the top
// level, which is now read whole (see Unmarshal).
func FuzzEquivalent(f *testing.F) {
	for _, s := range []string{`{"name":"x","arguments":{"a":1}}`, `{"NAME":"x"}`, `[1,2]`, `{"a":1} trailing`, ``, ` `, `{"name":"x"`, `"s"`, `{"_meta":{"k":[1,{"z":null}]},"n":3}`, `{"n":"3"}`, `{"name":"\u00e9\ud800"}`, `{} {}`, `null`, `01`, `[01]`, `{"n":01}`, "\t\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if first := bytes.TrimLeft(data, " \t\r\n"); len(first) > 0 && (first[0] == '-' || first[0] >= '0' && first[0] <= '9') {
			return
		}
		for _, mk := range []func() any{
			func() any { return new(map[string]any) }, func() any { return new(params) }, func() any { return new(any) },
			func() any { return new([]sj.RawMessage) }, func() any { return new(int) }, func() any { return new(time.Duration) },
			func() any { return new(sj.RawMessage) }, func() any { return new([]int) },
		} {
			a, b := mk(), mk()
			ea := oldUnmarshal(data, a)
			eb := Unmarshal(data, b)
			if (ea == nil) != (eb == nil) || errors.Is(ea, io.EOF) != errors.Is(eb, io.EOF) {
				t.Fatalf("%q: old err %v, new err %v", data, ea, eb)
			}
			if ea == nil && !reflect.DeepEqual(a, b) {
				t.Fatalf("%q: old %#v new %#v", data, a, b)
			}
		}
	})
}
