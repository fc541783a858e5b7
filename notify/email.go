package notify

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/wneessen/go-mail"

	"github.com/omcp/arap/directory"
)

// ChannelEmail is the e-mail channel's name.
const ChannelEmail = "email"

// EmailConfig configures the e-mail channel.
type EmailConfig struct {
	// URL is the SMTP server: smtp://host[:port] (STARTTLS required,
	// port 587 by default), smtps://host[:port] (TLS from the first byte,
	// port 465 by default), or smtp+insecure://host:port (no TLS, for a
	// loopback server only, such as the dev sink). It never carries a
	// password.
	URL string
	// Username and Password, when set, authenticate (AUTH PLAIN, over TLS).
	Username, Password string
	// From is the sender address.
	From string
	// TLS, if set, is the TLS configuration (tests set RootCAs).
	TLS *tls.Config
	// Timeout bounds dialling and each SMTP exchange (default 30s).
	Timeout time.Duration
}

// Email sends notifications over SMTP.
type Email struct {
	from string
	opts []mail.Option
	host string
}

// NewEmail checks c and returns the channel. No connection is made until a
// message is sent.
func NewEmail(c EmailConfig) (*Email, error) {
	u, err := url.Parse(c.URL)
	if err != nil || u.Host == "" || u.Path != "" && u.Path != "/" || u.RawQuery != "" {
		return nil, fmt.Errorf("notify: SMTP URL %q must be smtp://host[:port], smtps://host[:port] or smtp+insecure://host:port", c.URL)
	}
	if _, hasPassword := u.User.Password(); hasPassword {
		return nil, errors.New("notify: the SMTP URL must not carry a password; give it in ARAP_SMTP_PASSWORD or --smtp-password-file")
	}
	if c.From == "" {
		return nil, errors.New("notify: a sender address is required (--mail-from)")
	}
	if err := mail.NewMsg().From(c.From); err != nil {
		return nil, fmt.Errorf("notify: sender address %q: %w", c.From, err)
	}
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
	host := u.Hostname()
	tlsConf := c.TLS
	if tlsConf == nil {
		tlsConf = &tls.Config{}
	}
	tlsConf = tlsConf.Clone()
	tlsConf.ServerName, tlsConf.MinVersion = host, tls.VersionTLS12
	opts := []mail.Option{mail.WithTimeout(c.Timeout), mail.WithTLSConfig(tlsConf), mail.WithHELO("localhost")}
	port := 0
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
			return nil, fmt.Errorf("notify: SMTP URL %q: bad port", c.URL)
		}
	}
	switch u.Scheme {
	case "smtp":
		opts = append(opts, mail.WithTLSPortPolicy(mail.TLSMandatory))
	case "smtps":
		opts = append(opts, mail.WithSSLPort(false))
	case "smtp+insecure":
		if ip, err := netip.ParseAddr(host); (err != nil || !ip.IsLoopback()) && host != "localhost" {
			return nil, fmt.Errorf("notify: smtp+insecure is for a loopback server only, not %q; use smtp:// (STARTTLS) or smtps://", host)
		}
		if c.Username != "" {
			return nil, errors.New("notify: no SMTP credentials over smtp+insecure (they would travel in clear)")
		}
		opts = append(opts, mail.WithTLSPolicy(mail.NoTLS))
	default:
		return nil, fmt.Errorf("notify: SMTP URL scheme %q is not smtp, smtps or smtp+insecure", u.Scheme)
	}
	if port != 0 {
		opts = append(opts, mail.WithPort(port)) // after the policies, which set their default ports
	}
	if c.Username != "" {
		opts = append(opts, mail.WithSMTPAuth(mail.SMTPAuthPlain), mail.WithUsername(c.Username), mail.WithPassword(c.Password))
	}
	return &Email{from: c.From, opts: opts, host: host}, nil
}

// Name implements Channel.
func (*Email) Name() string { return ChannelEmail }

// Address implements Channel: the directory's e-mail address.
func (*Email) Address(u *directory.User) string { return u.Email }

// Send implements Channel: one message with a plain-text and an HTML
// alternative, over a fresh connection.
func (e *Email) Send(ctx context.Context, m Message) error {
	msg := mail.NewMsg()
	if err := msg.From(e.from); err != nil {
		return fmt.Errorf("sender: %w", err)
	}
	if err := msg.To(m.To); err != nil {
		return fmt.Errorf("recipient: %w", err)
	}
	msg.Subject(m.Subject)
	msg.SetDate()
	if _, domain, ok := strings.Cut(e.from, "@"); ok && m.ID != "" {
		msg.SetMessageIDWithValue(m.ID + "@" + strings.TrimSuffix(domain, ">"))
	} else {
		msg.SetMessageID()
	}
	msg.SetGenHeader(mail.Header("Auto-Submitted"), "auto-generated")
	msg.SetBodyString(mail.TypeTextPlain, m.Text)
	msg.AddAlternativeString(mail.TypeTextHTML, m.HTML)
	c, err := mail.NewClient(e.host, e.opts...)
	if err != nil {
		return err
	}
	return c.DialAndSendWithContext(ctx, msg)
}
