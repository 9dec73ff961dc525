// Command registryd-image builds registryd's server image from release
// binaries, without a container engine or a base image to pull: an OCI
// image index (one image per platform) written as an OCI layout in a tar
// file, the form `skopeo copy oci-archive:FILE` reads (and, unpacked,
// `crane push DIR`). `make release` runs it; docs/operating.md says how to
// push and run the result.
//
//	registryd-image -version v0.1.0 -revision HASH -created 2026-12-01T07:04:50Z \
//	    -binary linux/amd64=dist/registryd_v0.1.0_linux_amd64 \
//	    -binary linux/arm64=dist/registryd_v0.1.0_linux_arm64 \
//	    -o dist/registryd_v0.1.0_oci.tar
//
// Each image is built from scratch: two layers, the first the same for
// every platform (/etc/passwd and /etc/group naming the user nonroot,
// 65532; the CA certificates registryd's HTTPS calls to cloud providers
// trust; /tmp), the second /registryd. It runs `/registryd serve` as
// 65532:65532 on 0.0.0.0:8080. Every time in it is the commit's, so the
// same binaries make the same image, byte for byte.
//
// This is the server's image only. The agent runs nvidia-smi, which the
// NVIDIA container toolkit mounts in and which needs glibc: its image is
// deploy/Dockerfile's "agent" target, on a base with glibc.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "registryd-image:", err)
		}
		os.Exit(1)
	}
}

// The image's user, its entry point and what it listens on.
const (
	user   = "65532:65532"
	listen = "0.0.0.0:8080"
	port   = "8080/tcp"
)

var (
	entrypoint = []string{"/registryd"}
	command    = []string{"serve"}
)

// config is the command line.
type config struct {
	binaries binaries // by platform, in the order given
	version  string
	revision string
	source   string
	created  time.Time
	caCerts  string // "" leaves them out
	output   string
}

// binaries is the repeatable -binary OS/ARCH=FILE.
type binaries []binary

type binary struct {
	platform v1.Platform
	file     string
}

func (b *binaries) String() string { return fmt.Sprint(*b) }

func (b *binaries) Set(s string) error {
	plat, file, ok := strings.Cut(s, "=")
	goos, arch, ok2 := strings.Cut(plat, "/")
	if !ok || !ok2 || file == "" {
		return fmt.Errorf("%q: want OS/ARCH=FILE", s)
	}
	if goos != "linux" || elfMachine[arch] == elf.EM_NONE {
		return fmt.Errorf("%q: the platforms are linux/amd64 and linux/arm64", plat)
	}
	for _, have := range *b {
		if have.platform.Architecture == arch {
			return fmt.Errorf("%s given twice", plat)
		}
	}
	*b = append(*b, binary{platform: v1.Platform{OS: goos, Architecture: arch}, file: file})
	return nil
}

// elfMachine is the ELF machine of each architecture the image is built for.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fl := flag.NewFlagSet("registryd-image", flag.ContinueOnError)
	fl.SetOutput(stderr)
	fl.Var(&c.binaries, "binary", "`OS/ARCH=FILE`: a static registryd for that platform (repeat for each)")
	fl.StringVar(&c.version, "version", "", "the release's version (org.opencontainers.image.version, and the layout's ref.name)")
	fl.StringVar(&c.revision, "revision", "", "the commit (org.opencontainers.image.revision)")
	fl.StringVar(&c.source, "source", "https://github.com/registryd/registryd", "the source's URL (org.opencontainers.image.source)")
	created := fl.String("created", "", "the commit's time, RFC 3339: every time in the image (default: the Unix epoch)")
	fl.StringVar(&c.caCerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "PEM file of the CA certificates to trust, put at /etc/ssl/certs/ca-certificates.crt; empty for none")
	fl.StringVar(&c.output, "o", "", "the `FILE` to write: the OCI layout, as a tar")
	if err := fl.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fl.NArg() > 0:
		return c, fmt.Errorf("unexpected arguments %q", fl.Args())
	case len(c.binaries) == 0:
		return c, errors.New("no -binary")
	case c.version == "":
		return c, errors.New("no -version")
	case c.output == "":
		return c, errors.New("no -o")
	}
	c.created = time.Unix(0, 0).UTC()
	if *created != "" {
		t, err := time.Parse(time.RFC3339, *created)
		if err != nil {
			return c, fmt.Errorf("-created: %w", err)
		}
		c.created = t.UTC()
	}
	return c, nil
}

func run(args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	idx, err := imageIndex(c)
	if err != nil {
		return err
	}
	if err := writeArchive(c.output, idx, c.version, c.created); err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	var plats []string
	for _, b := range c.binaries {
		plats = append(plats, b.platform.String())
	}
	fmt.Fprintf(stdout, "%s: registryd %s, image index %s (%s)\n", c.output, c.version, d, strings.Join(plats, ", "))
	return nil
}

// labels are the image's OCI labels, and the index's annotations.
func labels(c config) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       "registryd",
		"org.opencontainers.image.description": "registryd serve: the worker-node registry of a GPU fleet",
		"org.opencontainers.image.version":     c.version,
		"org.opencontainers.image.source":      c.source,
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.created":     c.created.Format(time.RFC3339),
	}
	if c.revision != "" {
		l["org.opencontainers.image.revision"] = c.revision
	}
	return l
}

// imageIndex is the multi-platform image: one image a binary.
func imageIndex(c config) (v1.ImageIndex, error) {
	base, err := baseLayer(c)
	if err != nil {
		return nil, err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, b := range c.binaries {
		img, err := platformImage(c, b, base)
		if err != nil {
			return nil, err
		}
		plat := b.platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &plat}})
	}
	idx, ok := mutate.Annotations(idx, labels(c)).(v1.ImageIndex)
	if !ok {
		return nil, errors.New("annotating the index did not give an index")
	}
	return idx, nil
}

// platformImage is the image of one binary: the shared base layer, then
// the binary, and the configuration.
func platformImage(c config, b binary, base v1.Layer) (v1.Image, error) {
	bin, err := os.ReadFile(b.file)
	if err != nil {
		return nil, err
	}
	if err := checkStatic(bin, b.platform.Architecture); err != nil {
		return nil, fmt.Errorf("%s: %w", b.file, err)
	}
	binLayer, err := layer(c.created, []file{{name: "registryd", mode: 0o755, data: bin}})
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: b.platform.Architecture,
		OS:           b.platform.OS,
		Created:      v1.Time{Time: c.created},
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			User:         user,
			Entrypoint:   entrypoint,
			Cmd:          command,
			Env:          []string{"REGISTRY_LISTEN=" + listen},
			ExposedPorts: map[string]struct{}{port: {}},
			WorkingDir:   "/",
			Labels:       labels(c),
			// Docker's health check (Kubernetes uses its probes instead):
			// the binary asks itself, there being no shell or curl.
			Healthcheck: &v1.HealthConfig{
				Test:     []string{"CMD", "/registryd", "healthcheck"},
				Interval: 10 * time.Second, Timeout: 5 * time.Second, StartPeriod: 30 * time.Second, Retries: 3,
			},
		},
	})
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: c.created}
	return mutate.Append(img,
		mutate.Addendum{Layer: base, History: v1.History{Created: created, CreatedBy: "registryd-image: /etc/passwd, /etc/group, CA certificates, /tmp"}},
		mutate.Addendum{Layer: binLayer, History: v1.History{Created: created, CreatedBy: "registryd-image: /registryd " + c.version}},
	)
}

// checkStatic refuses a binary for another architecture, or one that
// needs a dynamic loader, which an image built from scratch lacks.
func checkStatic(bin []byte, arch string) error {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	if f.Machine != elfMachine[arch] {
		return fmt.Errorf("built for %s, not %s", f.Machine, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (build with CGO_ENABLED=0)")
		}
	}
	return nil
}

// The nonroot user and group of distroless images, so tools that look the
// user up find it.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group  = "root:x:0:\nnonroot:x:65532:\n"
)

// baseLayer is what every platform's image holds besides the binary.
func baseLayer(c config) (v1.Layer, error) {
	files := []file{
		{name: "etc/", mode: fs.ModeDir | 0o755},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
	}
	if c.caCerts != "" {
		pem, err := os.ReadFile(c.caCerts)
		if err != nil {
			return nil, fmt.Errorf("CA certificates: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA certificates: %s holds no PEM certificate", c.caCerts)
		}
		files = append(files,
			file{name: "etc/ssl/", mode: fs.ModeDir | 0o755},
			file{name: "etc/ssl/certs/", mode: fs.ModeDir | 0o755},
			file{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: pem})
	}
	files = append(files, file{name: "tmp/", mode: fs.ModeDir | fs.ModeSticky | 0o777})
	return layer(c.created, files)
}

// file is one entry of a layer, owned by root.
type file struct {
	name string // a directory's ends in "/"
	mode fs.FileMode
	data []byte
}

// layer is a gzipped tar of files, in their order, every time mtime.
func layer(mtime time.Time, files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: int64(f.mode.Perm()), ModTime: mtime, Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: int64(len(f.data))}
		if f.mode&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		if f.mode.IsDir() {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}

// writeArchive writes idx as an OCI layout whose index.json names it
// version (org.opencontainers.image.ref.name), in a tar file at out.
func writeArchive(out string, idx v1.ImageIndex, version string, mtime time.Time) (err error) {
	dir, err := os.MkdirTemp("", "registryd-image")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": version})); err != nil {
		return err
	}

	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	tw := tar.NewWriter(tmp)
	// WalkDir goes in lexical order, so the tar is the same every time.
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		name, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(name), ModTime: mtime, Format: tar.FormatPAX}
		if d.IsDir() {
			h.Name, h.Typeflag, h.Mode = h.Name+"/", tar.TypeDir, 0o755
			return tw.WriteHeader(h)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, int64(len(b))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}
