package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"sort"
	"strings"
)

func mcpTools(fs *flag.FlagSet) action {
	f := newMCPFlags(fs, false, false)
	asJSON := fs.Bool("json", false, "print the tool definitions as the server sent them, as one JSON array")
	return func(s streams, _ []string) error {
		m, err := f.cmd(s.out)
		if err != nil {
			return err
		}
		ctx, stop := interruptible()
		defer stop()
		defs, rejected, err := m.client.ListTools(ctx)
		if err != nil {
			return err
		}
		for _, r := range rejected {
			fmt.Fprintf(s.note, "warning: tool %s left out: %v\n", r.Name, r.Reason)
		}
		if *asJSON {
			raws := make([]json.RawMessage, len(defs))
			for i, d := range defs {
				raws[i] = d.Raw
			}
			b, err := json.Marshal(raws)
			if err != nil {
				return err
			}
			return printJSON(s.out, b)
		}
		tools := make([]listedTool, 0, len(defs))
		for _, d := range defs {
			t := listedTool{Name: d.Name, Description: d.Description}
			_ = json.Unmarshal(d.Annotations, &t.Annotations) // none or not an object: no hints
			tools = append(tools, t)
		}
		sort.Slice(tools, func(i, j int) bool { return tools[i].Name < tools[j].Name })
		width := 0
		for _, t := range tools {
			width = max(width, len(t.Name))
		}
		for _, t := range tools {
			fmt.Fprintf(s.out, "%-*s  %-11s  %s\n", width, t.Name, t.hint(), summary(t.Description))
		}
		return nil
	}
}

// listedTool is what mcp tools shows of a tool.
type listedTool struct {
	Name        string
	Description string
	Annotations struct {
		ReadOnly    bool  `json:"readOnlyHint"`
		Destructive *bool `json:"destructiveHint"`
	}
}

// hint is what the tool's server says of its effects, as policies read it:
// read-only, destructive, or nothing said.
func (t listedTool) hint() string {
	switch {
	case t.Annotations.ReadOnly:
		return "read-only"
	case t.Annotations.Destructive != nil && *t.Annotations.Destructive:
		return "destructive"
	}
	return "-"
}

// summary is a description's first sentence, at most 72 characters.
func summary(d string) string {
	d, _, _ = strings.Cut(strings.TrimSpace(d), "\n")
	if i := strings.Index(d, ". "); i >= 0 {
		d = d[:i+1]
	}
	if r := []rune(d); len(r) > 72 {
		d = string(r[:71]) + "…"
	}
	return d
}
