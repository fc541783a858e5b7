// Package mailsink is a real SMTP server on loopback that keeps what it
// receives in memory, bounded: `arapd dev`'s mail sink (listed at /dev/mail)
// and the tests' mail server. Messages are parsed as MIME (net/mail,
// mime/multipart), so a reader sees the plain-text and HTML parts as a mail
// client would.
package mailsink

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net"
	"net/http"
	"net/mail"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// Message is one received message.
type Message struct {
	To         []string    `json:"to"`
	From       string      `json:"-"`
	Subject    string      `json:"subject"`
	Text       string      `json:"text"`
	HTML       string      `json:"-"`
	Raw        []byte      `json:"-"`
	Header     mail.Header `json:"-"`
	ReceivedAt time.Time   `json:"received_at"`
}

// Options configure a Sink.
type Options struct {
	// Addr to listen on; 127.0.0.1:0 when empty.
	Addr string
	// Keep bounds the messages kept (oldest dropped first); 200 when 0.
	Keep int
	// Username and Password, when set, are required (AUTH PLAIN).
	Username, Password string
	// TLS, when set, is offered: by STARTTLS, or from the first byte when
	// Implicit.
	TLS      *tls.Config
	Implicit bool
}

// Sink is a running SMTP server.
type Sink struct {
	o      Options
	srv    *smtp.Server
	ln     net.Listener
	mu     sync.Mutex
	msgs   []Message
	notify chan struct{}
}

// MaxMessageBytes bounds one message.
const MaxMessageBytes = 1 << 20

// Start listens and serves until Close.
func Start(o Options) (*Sink, error) {
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	if o.Keep == 0 {
		o.Keep = 200
	}
	s := &Sink{o: o, notify: make(chan struct{})}
	s.srv = smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return &session{sink: s}, nil }))
	s.srv.Domain = "localhost"
	s.srv.ReadTimeout, s.srv.WriteTimeout = 30*time.Second, 30*time.Second
	s.srv.MaxMessageBytes = MaxMessageBytes
	s.srv.MaxRecipients = 50
	s.srv.TLSConfig = o.TLS
	var err error
	if o.TLS != nil && o.Implicit {
		s.ln, err = tls.Listen("tcp", o.Addr, o.TLS)
	} else {
		s.ln, err = net.Listen("tcp", o.Addr)
	}
	if err != nil {
		return nil, fmt.Errorf("mailsink: listen: %w", err)
	}
	go func() { _ = s.srv.Serve(s.ln) }()
	return s, nil
}

// Addr is the address the sink listens on.
func (s *Sink) Addr() string { return s.ln.Addr().String() }

// Close stops the server.
func (s *Sink) Close() error { return s.srv.Close() }

// Messages returns what was received, oldest first.
func (s *Sink) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.msgs...)
}

func (s *Sink) add(m Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs = append(s.msgs, m)
	if len(s.msgs) > s.o.Keep {
		s.msgs = append([]Message(nil), s.msgs[len(s.msgs)-s.o.Keep:]...)
	}
}

type session struct {
	sink   *Sink
	authed bool
	from   string
	to     []string
}

func (se *session) AuthMechanisms() []string {
	if se.sink.o.Username == "" {
		return nil
	}
	return []string{sasl.Plain}
}

func (se *session) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if user != se.sink.o.Username || pass != se.sink.o.Password {
			return errors.New("invalid username or password")
		}
		se.authed = true
		return nil
	}), nil
}

func (se *session) allowed() error {
	if se.sink.o.Username != "" && !se.authed {
		return smtp.ErrAuthRequired
	}
	return nil
}

func (se *session) Mail(from string, _ *smtp.MailOptions) error {
	if err := se.allowed(); err != nil {
		return err
	}
	se.from = from
	return nil
}

func (se *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	if err := se.allowed(); err != nil {
		return err
	}
	se.to = append(se.to, to)
	return nil
}

func (se *session) Data(r io.Reader) error {
	if err := se.allowed(); err != nil {
		return err
	}
	raw, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	m, err := Parse(raw)
	if err != nil {
		return &smtp.SMTPError{Code: 554, Message: "unparsable message: " + err.Error()}
	}
	m.To, m.From, m.ReceivedAt = se.to, se.from, time.Now().UTC()
	se.sink.add(*m)
	return nil
}

func (se *session) Reset()        { se.from, se.to = "", nil }
func (se *session) Logout() error { return nil }

// Parse reads a MIME message: its subject, and its text/plain and
// text/html parts (top level or one multipart level down).
func Parse(raw []byte) (*Message, error) {
	msg, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	subject, err := new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
	if err != nil {
		return nil, fmt.Errorf("subject: %w", err)
	}
	out := &Message{Subject: subject, Raw: raw, Header: msg.Header}
	if err := readPart(out, msg.Header.Get("Content-Type"), msg.Header.Get("Content-Transfer-Encoding"), msg.Body, 0); err != nil {
		return nil, err
	}
	return out, nil
}

func readPart(out *Message, ctype, encoding string, body io.Reader, depth int) error {
	mt, params, err := mime.ParseMediaType(ctype)
	if err != nil {
		return fmt.Errorf("content type %q: %w", ctype, err)
	}
	if strings.HasPrefix(mt, "multipart/") {
		if depth > 2 {
			return errors.New("multipart nested too deep")
		}
		mr := multipart.NewReader(body, params["boundary"])
		for {
			p, err := mr.NextRawPart()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if err := readPart(out, p.Header.Get("Content-Type"), p.Header.Get("Content-Transfer-Encoding"), p, depth+1); err != nil {
				return err
			}
		}
	}
	switch strings.ToLower(encoding) {
	case "quoted-printable":
		body = quotedprintable.NewReader(body)
	case "base64":
		body = base64.NewDecoder(base64.StdEncoding, body) // it skips line breaks
	}
	b, err := io.ReadAll(io.LimitReader(body, MaxMessageBytes))
	if err != nil {
		return err
	}
	text := strings.ReplaceAll(string(b), "\r\n", "\n") // as a reader's mail client shows it
	switch mt {
	case "text/plain":
		out.Text = text
	case "text/html":
		out.HTML = text
	}
	return nil
}

// Handler serves the received messages: HTML at path, JSON at path+".json"
// (a list of {to, subject, text, received_at}, newest first).
func (s *Sink) Handler(path string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+path+".json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(newestFirst(s.Messages()))
	})
	mux.HandleFunc("GET "+path, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
		_ = page.Execute(w, newestFirst(s.Messages()))
	})
	return mux
}

func newestFirst(ms []Message) []Message {
	out := make([]Message, len(ms))
	for i, m := range ms {
		if m.To == nil {
			m.To = []string{}
		}
		out[len(ms)-1-i] = m
	}
	return out
}

// The page shows the plain-text part only: mail HTML is not rendered here.
var page = template.Must(template.New("mail").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Dev mail sink</title>
<style>body{font-family:system-ui,sans-serif;max-width:60rem;margin:1rem auto;padding:0 1rem}
article{border:1px solid #767676;border-radius:4px;padding:.5rem 1rem;margin:1rem 0}pre{white-space:pre-wrap}</style></head>
<body><h1>Dev mail sink</h1>
<p>Notifications sent by <code>arapd dev</code> land here instead of a real mail server (newest first; JSON at <a href="/dev/mail.json">/dev/mail.json</a>).</p>
{{range .}}<article><h2>{{.Subject}}</h2><p>To {{range $i, $t := .To}}{{if $i}}, {{end}}{{$t}}{{end}} · {{.ReceivedAt.Format "2006-01-02 15:04:05 MST"}}</p><pre>{{.Text}}</pre></article>
{{else}}<p>No messages yet.</p>{{end}}
</body></html>`))
