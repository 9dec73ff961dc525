package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// certCheckEvery is how often, at most, a handshake looks at whether the
// certificate's files changed: two stats a second at the most.
const certCheckEvery = time.Second

// certFiles is serve's certificate, read from REGISTRY_TLS_CERT_FILE and
// REGISTRY_TLS_KEY_FILE and read again when either file changes, so a
// renewed certificate is served without a restart.
//
// A change is seen by the files' modification time and size, through
// os.Stat, which follows symbolic links: Kubernetes updates a Secret
// volume by swapping a symbolic link to a folder of new files, cert-manager
// by having it do so, an operator by rewriting the files in place; each
// changes what the path's stat says. A pair that does not load (half
// written, mismatched, unreadable) is logged once per change of the files
// and the certificate read before stays in use.
type certFiles struct {
	certFile, keyFile string
	logger            *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate // the one served
	stamp   [2]fileStamp     // of the files last read, whether they loaded or not
	checked time.Time        // when the stamps were last compared
}

// fileStamp is what a stat says of a file that changes when it is
// rewritten; the zero stamp is a file that could not be stat'ed.
type fileStamp struct {
	mod  time.Time
	size int64
}

// loadCertFiles reads the pair, which must load: a startup with a
// certificate it cannot serve fails, naming the files.
func loadCertFiles(certFile, keyFile string, logger *slog.Logger) (*certFiles, error) {
	c := &certFiles{certFile: certFile, keyFile: keyFile, logger: logger}
	c.stamp = c.stat()
	cert, err := c.read()
	if err != nil {
		return nil, err
	}
	c.cert, c.checked = cert, time.Now()
	return c, nil
}

func (c *certFiles) stat() [2]fileStamp {
	var s [2]fileStamp
	for i, name := range []string{c.certFile, c.keyFile} {
		if fi, err := os.Stat(name); err == nil {
			s[i] = fileStamp{mod: fi.ModTime(), size: fi.Size()}
		}
	}
	return s
}

// read loads the pair, with an error naming both settings and what is
// wrong.
func (c *certFiles) read() (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err == nil {
		cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0])
	}
	if err != nil {
		return nil, fmt.Errorf("REGISTRY_TLS_CERT_FILE=%s and REGISTRY_TLS_KEY_FILE=%s: %w", c.certFile, c.keyFile, err)
	}
	return &cert, nil
}

// getCertificate is tls.Config.GetCertificate: the current certificate,
// after reading the files again if they changed since the last look (at
// most once per certCheckEvery).
func (c *certFiles) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.checked) >= certCheckEvery {
		c.checked = now
		c.reload()
	}
	return c.cert, nil
}

// reload reads the pair again when its stamps changed. c.mu held.
func (c *certFiles) reload() {
	stamp := c.stat()
	if stamp == c.stamp {
		return
	}
	c.stamp = stamp
	cert, err := c.read()
	if err != nil {
		c.logger.Error("the TLS certificate's files changed but do not load; still serving the previous certificate",
			"err", err, "not_after", c.cert.Leaf.NotAfter)
		return
	}
	c.cert = cert
	c.logger.Info("TLS certificate reloaded", "subject", cert.Leaf.Subject.String(), "not_after", cert.Leaf.NotAfter)
}

// tlsConfig is serve's TLS: version 1.2 at least, the certificate from
// files, HTTP/2 and HTTP/1.1 (net/http adds them when it serves).
func (c *certFiles) tlsConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: c.getCertificate}
}

// loadTLSFiles reads REGISTRY_TLS_CERT_FILE and REGISTRY_TLS_KEY_FILE,
// which go together: both set, serve speaks TLS; neither, plain HTTP.
func loadTLSFiles(getenv func(string) string, errs *[]string) (certFile, keyFile string) {
	certFile, keyFile = getenv("REGISTRY_TLS_CERT_FILE"), getenv("REGISTRY_TLS_KEY_FILE")
	if (certFile == "") != (keyFile == "") {
		set, unset := "REGISTRY_TLS_CERT_FILE", "REGISTRY_TLS_KEY_FILE"
		if certFile == "" {
			set, unset = unset, set
		}
		*errs = append(*errs, fmt.Sprintf("REGISTRY_TLS_CERT_FILE and REGISTRY_TLS_KEY_FILE go together: %s is set, %s is not", set, unset))
	}
	return certFile, keyFile
}
