// Package yamlfile decodes a YAML configuration file strictly (unknown keys
// refused) and reports every problem with its file and line, the same way
// for each kind of file arap reads (the policy, the upstreams file).
package yamlfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Problem is one error at one line (0: the file as a whole).
type Problem struct {
	Line    int
	Message string
}

// Error lists every problem found in one file. Its message names the file
// and line of each ("FILE:LINE: reason").
type Error struct {
	What     string // what kind of file: "policy", "upstreams"
	Source   string // the file's name
	Problems []Problem
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %d problem(s)", e.What, e.Source, len(e.Problems))
	for _, p := range e.Problems {
		if p.Line > 0 {
			fmt.Fprintf(&b, "\n  %s:%d: %s", e.Source, p.Line, p.Message)
		} else {
			fmt.Fprintf(&b, "\n  %s: %s", e.Source, p.Message)
		}
	}
	return b.String()
}

// Add records a problem at line.
func (e *Error) Add(line int, format string, args ...any) {
	e.Problems = append(e.Problems, Problem{Line: line, Message: fmt.Sprintf(format, args...)})
}

// Err is e when it holds a problem, else nil.
func (e *Error) Err() error {
	if len(e.Problems) == 0 {
		return nil
	}
	return e
}

// Decode decodes data into v, refusing keys v does not know. On failure it
// adds each error to e with its line and returns false; an empty document
// decodes to v unchanged.
func Decode(data []byte, v any, e *Error) bool {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(v)
	if err == nil || errors.Is(err, io.EOF) {
		return true
	}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		for _, m := range te.Errors {
			e.Add(lineOf(m), "%s", stripLine(m))
		}
	} else {
		e.Add(lineOf(err.Error()), "%s", stripLine(strings.TrimPrefix(err.Error(), "yaml: ")))
	}
	return false
}

// yaml.v3 puts "line N: " in front of a message (twice when a custom
// UnmarshalYAML already named its line); the line goes in Problem.Line.
var lineRE = regexp.MustCompile(`line (\d+):?\s*`)

func lineOf(msg string) int {
	m := lineRE.FindStringSubmatch(msg)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func stripLine(msg string) string {
	return strings.TrimSpace(lineRE.ReplaceAllString(msg, ""))
}

// ItemLines are the lines of the items of the sequence under the top-level
// key of a YAML document (none when there is no such sequence).
func ItemLines(doc []byte, key string) []int {
	var root yaml.Node
	if yaml.Unmarshal(doc, &root) != nil || len(root.Content) == 0 {
		return nil
	}
	m := root.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key && m.Content[i+1].Kind == yaml.SequenceNode {
			var lines []int
			for _, item := range m.Content[i+1].Content {
				lines = append(lines, item.Line)
			}
			return lines
		}
	}
	return nil
}
