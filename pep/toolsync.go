package pep

import (
	"fmt"
	"maps"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/omcp/arap/mcp/tasks"
)

// The gate's tools as the SDK server offers them: registered at NewServer,
// and brought up to date when a source's tools change (ToolsChanged).

// ToolsChanged tells the server that a source's tools changed (an
// upstream's list): it offers the current ones now, and the listen streams
// that opted in hear of what changed (notifications/tools/list_changed,
// and prompts' and resources'). NewServer follows the upstream registry's
// changes with it.
func (s *Server) ToolsChanged() {
	s.syncTools()
	s.syncOffers()
}

// syncTools makes the gate's tools registered on the SDK server (which
// answers tools/list and routes tools/call to relay) the sources' current
// ones, definitions as they give them: a tool added, changed or gone
// upstream is listed so at the next tools/list.
func (s *Server) syncTools() {
	tools, skipped := s.gate.catalog.list()
	s.toolsMu.Lock()
	defer s.toolsMu.Unlock()
	now := make(map[string]string, len(tools))
	changed := false
	for _, t := range tools {
		if s.shown[t.Name] == t.Digest {
			now[t.Name] = t.Digest
			continue
		}
		changed = true
		if err := addTool(s.sdk, t); err != nil {
			skipped = append(skipped, err)
			continue
		}
		now[t.Name] = t.Digest
	}
	var gone []string
	for name := range s.shown {
		if _, ok := now[name]; !ok {
			gone = append(gone, name)
		}
	}
	if len(gone) > 0 {
		changed = true
		s.sdk.RemoveTools(gone...)
	}
	if !maps.Equal(s.shown, now) {
		s.changes.listChanged(tasks.NotificationToolsListChanged)
	}
	s.shown = now
	if changed {
		for _, err := range skipped {
			s.log.Warn("tool not offered", "error", err.Error())
		}
	}
}

// syncTool registers the gate's tool t on the SDK server if it is not, as
// it is now, so a tools/call of a tool new since the last tools/list
// reaches relay.
func (s *Server) syncTool(t *offered) {
	s.toolsMu.Lock()
	defer s.toolsMu.Unlock()
	if s.shown[t.Name] == t.Digest {
		return
	}
	if err := addTool(s.sdk, t); err != nil {
		s.log.Warn("tool not offered", "error", err.Error())
		return
	}
	s.shown[t.Name] = t.Digest
	s.changes.listChanged(tasks.NotificationToolsListChanged)
}

// addTool registers t on the SDK server, which panics on a definition it
// cannot take (an upstream's): that tool is left out instead.
func addTool(s *sdk.Server, t *offered) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("pep: tool %q of %s: %v", t.Name, upstreamName(t.Upstream), r)
		}
	}()
	s.AddTool(t.sdkTool(), relay)
	return nil
}
