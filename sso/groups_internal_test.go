package sso

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGroupsClaim(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string][]string{
		`["treasury","platform"]`: {"treasury", "platform"},
		`"treasury"`:              {"treasury"},
		`["treasury",7,null]`:     {"treasury"},
		`{"a":1}`:                 nil,
		``:                        nil,
		`[]`:                      nil,
	} {
		require.Equal(t, want, groups(json.RawMessage(raw)), raw)
	}
}
