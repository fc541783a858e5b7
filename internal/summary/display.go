package summary

import (
	"fmt"
	"html/template"
	"strings"

	"github.com/omcp/arap/internal/visible"
)

// Show renders s as one inline HTML value. A character a person could not
// see or could mistake is never written: a highlighted, labelled marker
// stands in its place. Each value is its own bidirectional isolate (<bdi>,
// or dir=auto with unicode-bidi: plaintext for blocks), so right-to-left
// text in one value cannot reorder the page around it.
func Show(s string) template.HTML { return render(s, false) }

// ShowBlock renders s as a block of lines (indented JSON).
func ShowBlock(s string) template.HTML { return render(s, true) }

// ShowField renders a field's value, as a block when it spans lines.
func ShowField(f Field) template.HTML { return render(f.Value, f.Multiline) }

// Plain is s for places that take text only (attributes, titles, plain-text
// mail): markers are written as "<U+202E>" text.
func Plain(s string) string { return visible.Marked(s, false) }

// PlainBlock is Plain for a block of lines: line breaks are kept.
func PlainBlock(s string) string { return visible.Marked(s, true) }

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
		b.WriteString(string(Marker(*seg.Marker)))
	}
	if multiline {
		b.WriteString(`</pre>`)
	} else {
		b.WriteString(`</bdi>`)
	}
	return template.HTML(b.String()) // built from escaped pieces only
}

// Marker is the highlighted, labelled stand-in for one character.
func Marker(f visible.Finding) template.HTML {
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

// MaxNotes bounds the warning's list; the rest is counted.
const MaxNotes = 50

// Notes collects the hidden characters of what a page shows, one note per
// place and code point.
type Notes struct {
	List    []Note
	Omitted int
}

// Text notes the hidden characters of one string shown at where.
func (n *Notes) Text(where, s string) {
	for _, f := range visible.Scan(s, false) {
		n.add(where, f)
	}
}

// Value notes the hidden characters of a JSON value shown at where,
// naming the path inside it.
func (n *Notes) Value(where string, v any) {
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

func (n *Notes) add(where string, f visible.Finding) {
	for i := range n.List {
		if n.List[i].Where == where && n.List[i].Finding.Code == f.Code {
			n.List[i].Count++
			return
		}
	}
	if len(n.List) == MaxNotes {
		n.Omitted++
		return
	}
	n.List = append(n.List, Note{Where: where, Finding: f, Count: 1})
}
