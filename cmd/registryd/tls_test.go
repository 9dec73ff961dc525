package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/tlstest"
)

// secretVolume is a folder laid out as the kubelet lays out a Secret
// volume: tls.crt and tls.key are links into ..data, a link to a folder of
// the current files, which an update replaces by renaming a new link over
// it (the files' paths never change; what they lead to does).
type secretVolume struct {
	t   *testing.T
	dir string
	n   int
}

func newSecretVolume(t *testing.T, p tlstest.Pair) *secretVolume {
	v := &secretVolume{t: t, dir: t.TempDir()}
	v.update(p)
	for _, name := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(v.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

func (v *secretVolume) files() (cert, key string) {
	return filepath.Join(v.dir, "tls.crt"), filepath.Join(v.dir, "tls.key")
}

// update swaps in a folder holding p, atomically.
func (v *secretVolume) update(p tlstest.Pair) {
	v.t.Helper()
	v.n++
	ts := fmt.Sprintf("..%d", v.n)
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o700); err != nil {
		v.t.Fatal(err)
	}
	p.Write(v.t, filepath.Join(v.dir, ts))
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
}

// tlsGet asks url on a new connection, trusting ca, with HTTP/2 offered.
func tlsGet(t *testing.T, ca *tlstest.CA, url string, token string) (*http.Response, string, error) {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	method := http.MethodGet
	if token != "" {
		method = http.MethodPost
	}
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// servedSerial is the serial of the certificate serve presents now.
func servedSerial(t *testing.T, ca *tlstest.CA, url string) *big.Int {
	t.Helper()
	resp, body, err := tlsGet(t, ca, url+"/healthz", "")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /healthz over TLS: %v %v %s", resp, err, body)
	}
	return resp.TLS.PeerCertificates[0].SerialNumber
}

// awaitSerial waits, at most 30s, until serve presents the certificate of
// serial.
func awaitSerial(t *testing.T, ca *tlstest.CA, url string, serial *big.Int, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for servedSerial(t, ca, url).Cmp(serial) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not served within 30s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// serve with a certificate, as a process of its own run where the Go
// runtime's own default would let TLS 1.0 and 1.1 in
// (GODEBUG=tls10server=1), so that only serve's minimum refuses them:
// it answers over TLS (HTTP/2) and nothing in clear; TLS 1.1 is refused;
// healthcheck works; a renewed certificate swapped in as the kubelet
// swaps a Secret is served without a restart; a new pair that does not
// load is logged and the previous certificate kept; a good pair
// rewritten in place is served again.
func TestServeTLS(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "registryd test CA")
	first := ca.Issue("127.0.0.1", "localhost")
	vol := newSecretVolume(t, first)
	certFile, keyFile := vol.files()
	env := map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_LISTEN": "127.0.0.1:0", "REGISTRY_TLS_CERT_FILE": certFile, "REGISTRY_TLS_KEY_FILE": keyFile,
		"GODEBUG": "tls10server=1"}
	p := startProcess(t, env, "serve")
	url := p.serving(t)
	if !strings.HasPrefix(url, "https://") {
		t.Fatalf("serving on %s, want https", url)
	}
	addr := strings.TrimPrefix(url, "https://")

	resp, body, err := tlsGet(t, ca, url+"/v1/nodes/list", adminToken(t, env))
	if err != nil || resp.StatusCode != 200 || resp.Proto != "HTTP/2.0" {
		t.Fatalf("list over TLS: %v %v %s", resp, err, body)
	}
	if got := resp.TLS.PeerCertificates[0].SerialNumber; got.Cmp(first.Serial) != 0 {
		t.Errorf("served serial %v, want %v", got, first.Serial)
	}
	if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain http: %s, want 400", resp.Status)
		}
	}
	for _, v := range []struct {
		version uint16
		ok      bool
	}{{tls.VersionTLS11, false}, {tls.VersionTLS10, false}, {tls.VersionTLS12, true}, {tls.VersionTLS13, true}} {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: v.version, MaxVersion: v.version})
		if err == nil {
			c.Close()
		}
		if (err == nil) != v.ok {
			t.Errorf("a client of %s only: %v, want ok=%v", tls.VersionName(v.version), err, v.ok)
		}
	}

	hc := map[string]string{"REGISTRY_LISTEN": addr, "REGISTRY_TLS_CERT_FILE": certFile}
	if out, stderr, err := runCmd(t, hc, "healthcheck"); err != nil || !strings.Contains(out, "https://") || !strings.Contains(out, "200 OK") {
		t.Errorf("healthcheck: %v %q %q", err, out, stderr)
	}
	if _, _, err := runCmd(t, map[string]string{"REGISTRY_LISTEN": addr}, "healthcheck"); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("healthcheck in plain http of a TLS serve: %v", err)
	}

	// cert-manager renews: the kubelet swaps the volume's files.
	renewed := ca.Issue("127.0.0.1", "localhost")
	vol.update(renewed)
	awaitSerial(t, ca, url, renewed.Serial, "the renewed certificate")

	// A new pair that does not load (another certificate's key): logged,
	// and the renewed one kept.
	other := ca.Issue("127.0.0.1")
	bad := tlstest.Pair{Cert: other.Cert, Key: first.Key}
	vol.update(bad)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.stderr.String(), "do not load; still serving the previous certificate") {
		if time.Now().After(deadline) {
			t.Fatalf("no error logged within 30s of a bad pair; stderr:\n%s", p.stderr.String())
		}
		servedSerial(t, ca, url) // a handshake, which looks at the files
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(p.stderr.String(), "private key does not match public key") {
		t.Errorf("the log does not say what is wrong:\n%s", p.stderr.String())
	}
	for range 3 {
		if got := servedSerial(t, ca, url); got.Cmp(renewed.Serial) != 0 {
			t.Fatalf("after a bad pair, serial %v is served, want the renewed %v", got, renewed.Serial)
		}
		time.Sleep(600 * time.Millisecond)
	}

	// Files rewritten in place (no links swapped) are seen too.
	again := ca.Issue("127.0.0.1")
	target, err := filepath.EvalSymlinks(certFile)
	if err != nil {
		t.Fatal(err)
	}
	again.Write(t, filepath.Dir(target))
	awaitSerial(t, ca, url, again.Serial, "a pair rewritten in place")
	// Informational lines are written in batches: wait for the second.
	for deadline := time.Now().Add(10 * time.Second); strings.Count(p.stderr.String(), "TLS certificate reloaded") < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the reloads are not both logged within 10s:\n%s", p.stderr.String())
		}
	}
}

// The two settings go together, and a pair that does not load stops the
// start, naming the files and what is wrong.
func TestServeTLSSettings(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t, "registryd test CA")
	good := ca.Issue("127.0.0.1")
	certFile, keyFile := good.Write(t, t.TempDir())
	otherCert, _ := ca.Issue("127.0.0.1").Write(t, t.TempDir())
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	tlstest.WriteFile(t, garbage, []byte("not PEM\n"))
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		name, cert, key, want string
	}{
		{"the certificate alone", certFile, "", "REGISTRY_TLS_CERT_FILE and REGISTRY_TLS_KEY_FILE go together: REGISTRY_TLS_CERT_FILE is set, REGISTRY_TLS_KEY_FILE is not"},
		{"the key alone", "", keyFile, "REGISTRY_TLS_CERT_FILE and REGISTRY_TLS_KEY_FILE go together: REGISTRY_TLS_KEY_FILE is set, REGISTRY_TLS_CERT_FILE is not"},
		{"a key of another certificate", otherCert, keyFile, "private key does not match public key"},
		{"no certificate file", missing, keyFile, "REGISTRY_TLS_CERT_FILE=" + missing},
		{"not PEM", garbage, keyFile, "failed to find any PEM data in certificate input"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"REGISTRY_DATABASE_URL": "postgres://registry@127.0.0.1:1/registry", "REGISTRY_LISTEN": "127.0.0.1:0",
				"REGISTRY_TLS_CERT_FILE": tc.cert, "REGISTRY_TLS_KEY_FILE": tc.key}
			_, _, err := runCmd(t, env, "serve")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("serve: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
