// Package adminauth authenticates the EPP's admin port: a bearer token read
// from a file (a mounted Secret, never argv, environment or logs), mutual
// TLS, or both. The server side wraps the admin handler and builds its TLS
// config; the client side (a starting sibling, the quoter, the calibration
// Job) builds an HTTP transport that presents the same credentials.
//
// The token is compared in constant time over SHA-256 digests, so neither
// its bytes nor its length leak through timing (TestTokenRefused).
package adminauth

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
)

// Config is the admin port's authentication. Empty fields are off.
type Config struct {
	// TokenFile holds the bearer token every request must carry
	// (Authorization: Bearer <token>). Default "" (none).
	TokenFile string `yaml:"token_file"`
	// CertFile and KeyFile serve the port over TLS; a sibling presents the
	// same pair as its client certificate. Default "" (plain HTTP).
	CertFile string `yaml:"tls_cert_file"`
	KeyFile  string `yaml:"tls_key_file"`
	// ClientCAFile requires every client to present a certificate signed
	// by this CA (mutual TLS); siblings verify the server against it too.
	// Needs CertFile. Default "" (none).
	ClientCAFile string `yaml:"client_ca_file"`
	// ServerName is the name a sibling verifies in another EPP's
	// certificate (siblings are dialed by Pod IP). Default "": the
	// address dialed.
	ServerName string `yaml:"server_name"`
}

// Enabled says whether a reader must authenticate.
func (c Config) Enabled() bool { return c.TokenFile != "" || c.ClientCAFile != "" }

// TLS says whether the port serves TLS.
func (c Config) TLS() bool { return c.CertFile != "" }

// Validate reports settings that cannot work together; prefix names the
// YAML section in the errors.
func (c Config) Validate(prefix string) error {
	var errs []error
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, fmt.Errorf("%s.tls_cert_file and %s.tls_key_file go together", prefix, prefix))
	}
	if c.ClientCAFile != "" && c.CertFile == "" {
		errs = append(errs, fmt.Errorf("%s.client_ca_file needs %s.tls_cert_file: client certificates need TLS", prefix, prefix))
	}
	if c.ServerName != "" && c.CertFile == "" {
		errs = append(errs, fmt.Errorf("%s.server_name needs %s.tls_cert_file", prefix, prefix))
	}
	return errors.Join(errs...)
}

// ReadToken reads a token file: its content without surrounding white
// space. An empty token is refused. Errors name the file, never the token.
func ReadToken(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read token file: %w", err)
	}
	tok := []byte(strings.TrimSpace(string(b)))
	if len(tok) == 0 {
		return nil, fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}

// Token is a secret compared in constant time.
type Token [sha256.Size]byte

// NewToken returns the digest a presented token is compared with.
func NewToken(tok []byte) Token { return sha256.Sum256(tok) }

// Equal says whether presented is the token, in time independent of both.
func (t Token) Equal(presented string) bool {
	d := sha256.Sum256([]byte(presented))
	return subtle.ConstantTimeCompare(t[:], d[:]) == 1
}

// Handler wraps next: a request without the token gets 401 (no body that
// says why beyond that). Client certificates are checked by the TLS
// handshake (ServerTLS), before any request reaches it.
func (c Config) Handler(next http.Handler) (http.Handler, error) {
	if c.TokenFile == "" {
		return next, nil
	}
	raw, err := ReadToken(c.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("admin token: %w", err)
	}
	tok := NewToken(raw)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || !tok.Equal(got) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="omnious-epp-admin"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	}), nil
}

// ServerTLS is the admin listener's TLS config, nil without CertFile.
func (c Config) ServerTLS() (*tls.Config, error) {
	if c.CertFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("cannot load the admin TLS key pair: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.ClientCAFile != "" {
		pool, err := loadPool(c.ClientCAFile)
		if err != nil {
			return nil, err
		}
		tc.ClientCAs, tc.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// Client is what a reader of an admin port presents and trusts.
type Client struct {
	// TokenFile holds the bearer token sent with every request.
	TokenFile string
	// CAFile verifies the server's certificate; with it the URL scheme is
	// https. Default "": the system roots (only for an https URL).
	CAFile string
	// CertFile and KeyFile are the client certificate (mutual TLS).
	CertFile, KeyFile string
	// ServerName is verified in the server's certificate instead of the
	// dialed host.
	ServerName string
}

// Client is the reader's side of c: a sibling EPP presents its own
// certificate and token and trusts the client CA.
func (c Config) Client() Client {
	return Client{TokenFile: c.TokenFile, CAFile: c.ClientCAFile, CertFile: c.CertFile, KeyFile: c.KeyFile, ServerName: c.ServerName}
}

// Scheme is "https" when the client verifies a server certificate, else "http".
func (c Client) Scheme() string {
	if c.CAFile != "" || c.CertFile != "" {
		return "https"
	}
	return "http"
}

// Transport returns base (cloned; nil: a new transport) set up with the
// client's certificates, wrapped to send the token.
func (c Client) Transport(base *http.Transport) (http.RoundTripper, error) {
	var t *http.Transport
	if base != nil {
		t = base.Clone()
	} else {
		t = http.DefaultTransport.(*http.Transport).Clone()
	}
	if c.CAFile != "" || c.CertFile != "" || c.ServerName != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
		if c.CAFile != "" {
			pool, err := loadPool(c.CAFile)
			if err != nil {
				return nil, err
			}
			tc.RootCAs = pool
		}
		if c.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("cannot load the client key pair: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		t.TLSClientConfig = tc
	}
	if c.TokenFile == "" {
		return t, nil
	}
	tok, err := ReadToken(c.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("admin token: %w", err)
	}
	return bearer{next: t, value: "Bearer " + string(tok)}, nil
}

// bearer adds the Authorization header to every request.
type bearer struct {
	next  http.RoundTripper
	value string
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", b.value)
	return b.next.RoundTrip(r)
}

func loadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", path)
	}
	return pool, nil
}

// Loopback says whether addr (host:port, as a listener takes it) binds a
// loopback address only: "localhost" or a loopback IP. An empty or
// unspecified host binds every interface.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
