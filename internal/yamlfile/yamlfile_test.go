package yamlfile

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

type lined struct{ v string }

func (l *lined) UnmarshalYAML(n *yaml.Node) error {
	return &yaml.TypeError{Errors: []string{"line 3: line 3: not a thing"}}
}

func TestDecodeReportsEachProblemAtItsLine(t *testing.T) {
	var v struct {
		A int    `yaml:"a"`
		B string `yaml:"b"`
		C lined  `yaml:"c"`
	}
	e := &Error{What: "test", Source: "f.yaml"}
	require.False(t, Decode([]byte("a: x\nb: [1]\nc: 1\n"), &v, e))
	require.Equal(t, []Problem{
		{1, "cannot unmarshal !!str `x` into int"},
		{2, "cannot unmarshal !!seq into string"},
		{3, "not a thing"},
	}, e.Problems)
	require.Contains(t, e.Err().Error(), "test f.yaml: 3 problem(s)\n  f.yaml:1: cannot unmarshal")

	e = &Error{What: "test", Source: "f.yaml"}
	require.False(t, Decode([]byte("a: 1\nz: 2\n"), &v, e), "unknown keys are refused")
	require.Len(t, e.Problems, 1)
	require.Equal(t, 2, e.Problems[0].Line)
	require.Contains(t, e.Problems[0].Message, "field z not found")

	e = &Error{What: "test", Source: "f.yaml"}
	require.True(t, Decode(nil, &v, e), "an empty document decodes to nothing")
	require.NoError(t, e.Err())
}
