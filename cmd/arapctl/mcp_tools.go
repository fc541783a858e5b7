package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"sort"
	"strings"
)

func mcpTools(fs *flag.FlagSet) action {
	f := newMCPFlags(fs, false, false)
	return func(s streams, _ []string) error {
		m, err := f.cmd(s.out)
		if err != nil {
			return err
		}
		ctx, stop := interruptible()
		defer stop()
		tools, err := m.listTools(ctx)
		if err != nil {
			return err
		}
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
	Name        string `json:"name"`
	Description string `json:"description"`
	Annotations struct {
		ReadOnly    bool  `json:"readOnlyHint"`
		Destructive *bool `json:"destructiveHint"`
	} `json:"annotations"`
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

// listTools reads every page of tools/list, sorted by name.
func (m *mcpCmd) listTools(ctx context.Context) ([]listedTool, error) {
	var tools []listedTool
	params := map[string]any{}
	for range 20 { // pages; a server that pages forever is not followed
		resp, err := m.client.Call(ctx, "tools/list", "", params)
		if err != nil {
			return nil, err
		}
		if resp.Error != nil {
			return nil, resp.Error
		}
		var page struct {
			Tools      []listedTool `json:"tools"`
			NextCursor string       `json:"nextCursor"`
		}
		if err := json.Unmarshal(resp.Result, &page); err != nil {
			return nil, fmt.Errorf("tools/list: %w", err)
		}
		tools = append(tools, page.Tools...)
		if page.NextCursor == "" {
			break
		}
		params = map[string]any{"cursor": page.NextCursor}
	}
	sort.Slice(tools, func(i, j int) bool { return tools[i].Name < tools[j].Name })
	return tools, nil
}
