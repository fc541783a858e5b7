package webui

import (
	"html/template"

	"github.com/omcp/arap/internal/summary"
)

// Every string a page shows that came from a request, a vote or the audit
// trail goes through show (or showBlock, or plain where no markup can go).
// The rendering lives in internal/summary, which the notifications share,
// so a message and the page it links to mark the same characters the same
// way.

// show renders s as one inline value.
func show(s string) template.HTML { return summary.Show(s) }

// showBlock renders s as a block of lines (indented JSON).
func showBlock(s string) template.HTML { return summary.ShowBlock(s) }

// showField renders a field's value, as a block when it spans lines.
func showField(f Field) template.HTML { return summary.ShowField(f) }

// plain is s for places that take text only (attributes, the page title).
func plain(s string) string { return summary.Plain(s) }

// marker is the highlighted, labelled stand-in for one character.
var marker = summary.Marker

// Note is one kind of hidden character in one place of a request.
type Note = summary.Note

// notes collects the hidden characters of what a page shows.
type notes = summary.Notes
