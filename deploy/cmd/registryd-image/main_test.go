package main

import (
	"archive/tar"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/elf"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// buildRegistryd builds registryd as make release does, for linux on this
// machine's architecture, stamped with version.
func buildRegistryd(t *testing.T, version string) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "registryd")
	cmd := exec.Command(goTool, "build", "-trimpath", "-ldflags", "-s -w -X main.version="+version, "-o", bin, "./cmd/registryd")
	cmd.Dir = filepath.Join("..", "..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// caCerts is a PEM file of one self-signed CA certificate.
func caCerts(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "registryd-image test CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// readTar calls fn with each entry of the tar r.
func readTar(t *testing.T, r io.Reader, fn func(h *tar.Header, data []byte)) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		} else if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		fn(h, b)
	}
}

// untar unpacks the archive into a new folder.
func untar(t *testing.T, archive string) string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := t.TempDir()
	readTar(t, f, func(h *tar.Header, data []byte) {
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		var err error
		if h.Typeflag == tar.TypeDir {
			err = os.MkdirAll(p, 0o755)
		} else {
			err = errors.Join(os.MkdirAll(filepath.Dir(p), 0o755), os.WriteFile(p, data, 0o644))
		}
		if err != nil {
			t.Fatal(err)
		}
	})
	return dir
}

// entry is a file of an image's file system.
type entry struct {
	header *tar.Header
	data   []byte
}

// filesOf is the image's file system, its layers flattened.
func filesOf(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string]entry{}
	readTar(t, rc, func(h *tar.Header, data []byte) { files[strings.TrimSuffix(h.Name, "/")] = entry{h, data} })
	return files
}

// The image the builder writes, read back as skopeo or crane would read
// it: a layout naming the version, holding an index of one image for this
// machine's platform, configured to run `/registryd serve` as 65532 on
// 0.0.0.0:8080 with the OCI labels; its files are the binary, the CA
// certificates, the user and /tmp; and the binary taken out of it runs
// and says its version. Built twice, it is the same bytes.
func TestImage(t *testing.T) {
	t.Parallel()
	const version, revision, created = "v9.8.7", "0123456789abcdef0123456789abcdef01234567", "2026-12-01T07:04:50Z"
	bin, certs := buildRegistryd(t, version), caCerts(t)
	out := filepath.Join(t.TempDir(), "registryd_oci.tar")
	args := []string{"-version", version, "-revision", revision, "-created", created, "-ca-certs", certs,
		"-binary", "linux/" + runtime.GOARCH + "=" + bin, "-o", out}
	var stdout bytes.Buffer
	if err := run(args, &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	t.Log(stdout.String())

	p, err := layout.FromPath(untar(t, out))
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].MediaType != types.OCIImageIndex || tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != version {
		t.Fatalf("index.json: want one image index named %s: %+v", version, tm.Manifests)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.title":       "registryd",
		"org.opencontainers.image.description": "registryd serve: the worker-node registry of a GPU fleet",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.revision":    revision,
		"org.opencontainers.image.source":      "https://github.com/registryd/registryd",
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.created":     created,
	}
	if diff := cmp.Diff(wantLabels, im.Annotations); diff != "" {
		t.Errorf("index annotations (-want +got):\n%s", diff)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || im.Manifests[0].Platform.String() != "linux/"+runtime.GOARCH ||
		im.Manifests[0].MediaType != types.OCIManifestSchema1 {
		t.Fatalf("index: want one OCI image for linux/%s: %+v", runtime.GOARCH, im.Manifests)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	when, _ := time.Parse(time.RFC3339, created)
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH || !cf.Created.Equal(when) {
		t.Errorf("config: %s/%s created %v", cf.OS, cf.Architecture, cf.Created)
	}
	want := v1.Config{
		User:         "65532:65532",
		Entrypoint:   []string{"/registryd"},
		Cmd:          []string{"serve"},
		Env:          []string{"REGISTRY_LISTEN=0.0.0.0:8080"},
		ExposedPorts: map[string]struct{}{"8080/tcp": {}},
		WorkingDir:   "/",
		Labels:       wantLabels,
		Healthcheck: &v1.HealthConfig{Test: []string{"CMD", "/registryd", "healthcheck"},
			Interval: 10 * time.Second, Timeout: 5 * time.Second, StartPeriod: 30 * time.Second, Retries: 3},
	}
	if diff := cmp.Diff(want, cf.Config); diff != "" {
		t.Errorf("image config (-want +got):\n%s", diff)
	}

	files := filesOf(t, img)
	pem, err := os.ReadFile(certs)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]struct {
		mode int64
		data string
	}{
		"registryd":                         {0o755, ""},
		"etc/ssl/certs/ca-certificates.crt": {0o644, string(pem)},
		"etc/passwd":                        {0o644, passwd},
		"etc/group":                         {0o644, group},
		"tmp":                               {0o1777, ""},
	} {
		e, ok := files[name]
		switch {
		case !ok:
			t.Errorf("no /%s in the image", name)
		case e.header.Mode != want.mode || e.header.Uid != 0 || e.header.Gid != 0 || !e.header.ModTime.Equal(when):
			t.Errorf("/%s: mode %o, owner %d:%d, time %v; want %o, root's, %v", name, e.header.Mode, e.header.Uid, e.header.Gid, e.header.ModTime, want.mode, when)
		case want.data != "" && string(e.data) != want.data:
			t.Errorf("/%s: %q, want %q", name, e.data, want.data)
		}
	}
	if !strings.Contains(passwd, ":65532:65532:") {
		t.Errorf("/etc/passwd names no user 65532: %q", passwd)
	}

	if runtime.GOOS == "linux" {
		extracted := filepath.Join(t.TempDir(), "registryd")
		if err := os.WriteFile(extracted, files["registryd"].data, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(extracted, "version")
		cmd.Env = []string{}
		got, err := cmd.Output()
		if err != nil || !strings.HasPrefix(string(got), "registryd "+version+"\n") {
			t.Errorf("/registryd version: %v\n%s", err, got)
		}
	}

	// The same inputs, the same bytes.
	again := filepath.Join(t.TempDir(), "again.tar")
	args[len(args)-1] = again
	if err := run(args, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(out)
	b, _ := os.ReadFile(again)
	if !bytes.Equal(a, b) {
		t.Error("two builds from the same binary differ")
	}
}

// What the builder refuses: a binary for another architecture, one that
// is not a static ELF executable, a CA file with no certificate, and
// command lines it cannot use.
func TestImageRefused(t *testing.T) {
	t.Parallel()
	other := map[string]string{"amd64": "arm64", "arm64": "amd64"}[runtime.GOARCH]
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(t.TempDir(), "certs.pem")
	if err := os.WriteFile(notPEM, []byte("no certificates here\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "image.tar")
	type refusal struct {
		name, want string
		args       []string
	}
	tests := []refusal{
		{"not ELF", "not an ELF executable", []string{"-version", "v1", "-ca-certs", "", "-binary", "linux/amd64=" + notPEM, "-o", out}},
		{"CA file without certificates", "holds no PEM certificate", []string{"-version", "v1", "-ca-certs", notPEM, "-binary", "linux/amd64=" + self, "-o", out}},
		{"unknown platform", "the platforms are linux/amd64 and linux/arm64", []string{"-version", "v1", "-binary", "linux/riscv64=" + self, "-o", out}},
		{"platform twice", "given twice", []string{"-version", "v1", "-binary", "linux/amd64=" + self, "-binary", "linux/amd64=" + self, "-o", out}},
		{"no version", "no -version", []string{"-binary", "linux/amd64=" + self, "-o", out}},
		{"no binary", "no -binary", []string{"-version", "v1", "-o", out}},
	}
	if other != "" && runtime.GOOS == "linux" {
		tests = append(tests, refusal{"another architecture", "built for", []string{"-version", "v1", "-ca-certs", "", "-binary", "linux/" + other + "=" + self, "-o", out}})
	}
	// A dynamically linked program of this machine, where there is one.
	if sh, err := exec.LookPath("sh"); err == nil && runtime.GOOS == "linux" && elfMachine[runtime.GOARCH] != elf.EM_NONE {
		if f, err := elf.Open(sh); err == nil {
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP && f.Machine == elfMachine[runtime.GOARCH] {
					tests = append(tests, refusal{"dynamically linked", "dynamically linked", []string{"-version", "v1", "-ca-certs", "", "-binary", "linux/" + runtime.GOARCH + "=" + sh, "-o", out}})
				}
			}
			f.Close()
		}
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := run(tc.args, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("want an error containing %q, got %v", tc.want, err)
			}
		})
	}
	if _, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused build left %s: %v", out, err)
	}
}
