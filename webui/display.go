package webui

import (
	"fmt"
	"html/template"
	"strings"

	"github.com/omcp/arap/internal/visible"
)

// Every string a page shows that came from a request, a vote or the audit
// trail goes through show (or showBlock, or plain where no markup can go).
// A character a person could not see or could mistake (package visible) is
// never written: a highlighted, labelled marker such as U+202E stands in its
// place. Each value is its own bidirectional isolate (<bdi>, or dir=auto
// with unicode-bidi: plaintext for blocks), so right-to-left text in one
// value cannot reorder the page around it.

// show renders s as one inline value.
func show(s string) template.HTML { return render(s, false) }

// showBlock renders s as a block of lines (indented JSON).
func showBlock(s string) template.HTML { return render(s, true) }

// showField renders a field's value, as a block when it spans lines.
func showField(f Field) template.HTML { return render(f.Value, f.Multiline) }

// plain is s for places that take text only (attributes, the page title):
// markers are written as "<U+202E>" text.
func plain(s string) string { return visible.Marked(s, false) }

func render(s string, multiline bool) template.HTML {
	var b strings.Builder
	if multiline {
		b.WriteString(`<pre class="val" dir="auto">`)
	} else {
		b.WriteString(`<bdi class="val">`)
	}
	for _, seg := range visible.Segments(s, multiline) {
		if seg.Marker == nil {
			b.WriteString(template.HTMLEscapeString(seg.Text))
			continue
		}
		b.WriteString(string(marker(*seg.Marker)))
	}
	if multiline {
		b.WriteString(`</pre>`)
	} else {
		b.WriteString(`</bdi>`)
	}
	return template.HTML(b.String()) // built from escaped pieces only
}

// marker is the highlighted, labelled stand-in for one character.
func marker(f visible.Finding) template.HTML {
	return template.HTML(fmt.Sprintf(`<mark class="hidden-char" title="%s">%s</mark>`,
		template.HTMLEscapeString(f.Label()+": "+f.Why), template.HTMLEscapeString(f.Code)))
}

// Note is one kind of hidden character in one place of a request, for the
// warning at the top of the page.
type Note struct {
	Where   string
	Finding visible.Finding
	Count   int
}

// maxNotes bounds the warning's list; the rest is counted.
const maxNotes = 50

// notes collects the hidden characters of what a page shows, one note per
// place and code point.
type notes struct {
	list    []Note
	omitted int
}

// text notes the hidden characters of one string shown at where.
func (n *notes) text(where, s string) {
	for _, f := range visible.Scan(s, false) {
		n.add(where, f)
	}
}

// value notes the hidden characters of a JSON value shown at where,
// naming the path inside it.
func (n *notes) value(where string, v any) {
	for _, l := range visible.ScanValue(v) {
		w := where
		for i, p := range l.Path {
			if i == 0 {
				w += " “" + p + "”"
			} else {
				w += " › " + p
			}
		}
		if l.InName {
			w += " (in its name)"
		}
		n.add(w, l.Finding)
	}
}

func (n *notes) add(where string, f visible.Finding) {
	for i := range n.list {
		if n.list[i].Where == where && n.list[i].Finding.Code == f.Code {
			n.list[i].Count++
			return
		}
	}
	if len(n.list) == maxNotes {
		n.omitted++
		return
	}
	n.list = append(n.list, Note{Where: where, Finding: f, Count: 1})
}
