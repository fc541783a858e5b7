package notify_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/mailsink"
	"github.com/omcp/arap/notify"
)

// selfSigned is a certificate for 127.0.0.1 and the pool that trusts it.
func selfSigned(t *testing.T) (*tls.Config, *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "smtp test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, pool
}

var testMessage = notify.Message{To: "bob@example.com", Subject: "Approval needed: Treasury approval", Text: "plain part\n", HTML: "<p>html part</p>"}

// TestEmailOverTLSWithAuth: STARTTLS (smtp://) and implicit TLS (smtps://),
// each with AUTH PLAIN, deliver one MIME message with a plain-text and an
// HTML part to a real SMTP server.
func TestEmailOverTLSWithAuth(t *testing.T) {
	for _, implicit := range []bool{false, true} {
		serverTLS, roots := selfSigned(t)
		sink, err := mailsink.Start(mailsink.Options{TLS: serverTLS, Implicit: implicit, Username: "arap", Password: "s3cret"})
		require.NoError(t, err)
		t.Cleanup(func() { _ = sink.Close() })
		scheme := "smtp://"
		if implicit {
			scheme = "smtps://"
		}
		email, err := notify.NewEmail(notify.EmailConfig{URL: scheme + sink.Addr(), Username: "arap", Password: "s3cret",
			From: "arap@example.com", TLS: &tls.Config{RootCAs: roots}})
		require.NoError(t, err)
		require.NoError(t, email.Send(context.Background(), testMessage), scheme)
		got := sink.Messages()
		require.Len(t, got, 1)
		require.Equal(t, []string{"bob@example.com"}, got[0].To)
		require.Equal(t, testMessage.Subject, got[0].Subject)
		require.Equal(t, "plain part\n", got[0].Text)
		require.Equal(t, "<p>html part</p>", got[0].HTML)
		require.Contains(t, got[0].Header.Get("Content-Type"), "multipart/alternative")

		// A wrong password is refused, and nothing is delivered.
		wrong, err := notify.NewEmail(notify.EmailConfig{URL: scheme + sink.Addr(), Username: "arap", Password: "nope",
			From: "arap@example.com", TLS: &tls.Config{RootCAs: roots}})
		require.NoError(t, err)
		require.Error(t, wrong.Send(context.Background(), testMessage))
		require.Len(t, sink.Messages(), 1)
	}
}

// TestEmailRequiresTLS: smtp:// to a server that offers no STARTTLS fails
// rather than sending in clear; an untrusted certificate fails too.
func TestEmailRequiresTLS(t *testing.T) {
	plain, err := mailsink.Start(mailsink.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = plain.Close() })
	email, err := notify.NewEmail(notify.EmailConfig{URL: "smtp://" + plain.Addr(), From: "arap@example.com"})
	require.NoError(t, err)
	require.Error(t, email.Send(context.Background(), testMessage))
	require.Empty(t, plain.Messages())

	serverTLS, _ := selfSigned(t)
	tlsSink, err := mailsink.Start(mailsink.Options{TLS: serverTLS})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tlsSink.Close() })
	untrusted, err := notify.NewEmail(notify.EmailConfig{URL: "smtp://" + tlsSink.Addr(), From: "arap@example.com"})
	require.NoError(t, err)
	require.Error(t, untrusted.Send(context.Background(), testMessage))
	require.Empty(t, tlsSink.Messages())
}

// TestEmailConfigRefused: each bad configuration is refused with a
// specific error.
func TestEmailConfigRefused(t *testing.T) {
	for _, c := range []struct {
		cfg  notify.EmailConfig
		want string
	}{
		{notify.EmailConfig{URL: "smtp://user:pw@mail.example:587", From: "a@example.com"}, "must not carry a password"},
		{notify.EmailConfig{URL: "smtp+insecure://mail.example:25", From: "a@example.com"}, "loopback server only"},
		{notify.EmailConfig{URL: "smtp+insecure://127.0.0.1:25", From: "a@example.com", Username: "u"}, "no SMTP credentials over smtp+insecure"},
		{notify.EmailConfig{URL: "http://mail.example", From: "a@example.com"}, "is not smtp, smtps or smtp+insecure"},
		{notify.EmailConfig{URL: "smtp://mail.example:99999", From: "a@example.com"}, "bad port"},
		{notify.EmailConfig{URL: "smtp://mail.example"}, "sender address is required"},
		{notify.EmailConfig{URL: "smtp://mail.example", From: "not an address"}, "sender address"},
	} {
		_, err := notify.NewEmail(c.cfg)
		require.ErrorContains(t, err, c.want, c.cfg.URL)
	}
}
