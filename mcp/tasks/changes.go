package tasks

import "context"

// Changes serves the opt-ins of subscriptions/listen other than task ids:
// list changes and resource subscriptions. The tasks extension knows
// nothing of what is offered; a server that offers something (the gateway)
// plugs in here (Server.Changes).
type Changes interface {
	// Watch registers a listen stream of the caller in ctx (the request's
	// context, with whatever the server's authentication put in it) for
	// what it asks, and returns what it accepted, which the
	// acknowledgement echoes, and the stream's feed (nil when nothing was
	// accepted). A URI that is not offered or not allowed to the caller is
	// silently left out. An error means the request could not be decided.
	Watch(ctx context.Context, want Wants) (Wants, Feed, error)
}

// Wants are the opt-ins besides task ids, with their wire names.
type Wants struct {
	ToolsListChanged      bool     `json:"toolsListChanged,omitempty"`
	PromptsListChanged    bool     `json:"promptsListChanged,omitempty"`
	ResourcesListChanged  bool     `json:"resourcesListChanged,omitempty"`
	ResourceSubscriptions []string `json:"resourceSubscriptions,omitempty"`
}

// Any reports whether w asks for anything.
func (w Wants) Any() bool {
	return w.ToolsListChanged || w.PromptsListChanged || w.ResourcesListChanged || len(w.ResourceSubscriptions) > 0
}

// Feed is one stream's pending changes: Wake is signalled (at most one
// signal pending) when Take has something; Close unregisters the stream.
type Feed interface {
	Wake() <-chan struct{}
	Take() []Note
	Close()
}

// Note is one notification for a stream: Method is one of the
// Notification* list changes or NotificationResourceUpdated (with URI).
type Note struct {
	Method string
	URI    string
}

// MaxListenURIs bounds the resource URIs one listen stream may ask for.
const MaxListenURIs = 100
