package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The provider endpoints the deploy manifests and the README suggest are
// the ones the import docs give (the ConfigMap's used to differ: SCP's and
// E2E's base URLs).
func TestDeployEndpointsMatchDocs(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	docs, err := os.ReadFile(filepath.Join(root, "docs", "importing.md"))
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	check := func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range endpointRE.FindAllStringSubmatch(string(b), -1) {
			found++
			if !strings.Contains(string(docs), "`"+m[2]+"`") {
				t.Errorf("%s suggests %s=%s, which docs/importing.md does not give", strings.TrimPrefix(path, root+"/"), m[1], m[2])
			}
		}
		return nil
	}
	if err := filepath.WalkDir(filepath.Join(root, "deploy"), check); err != nil {
		t.Fatal(err)
	}
	if err := filepath.WalkDir(filepath.Join(root, "README.md"), check); err != nil {
		t.Fatal(err)
	}
	if found < 2 {
		t.Errorf("found %d endpoint examples under deploy/, want SCP's and E2E's", found)
	}
}

var endpointRE = regexp.MustCompile(`(REGISTRY_(?:SCP|E2E)_ENDPOINT)[:=]\s*"?(https?://[^\s"]+)`)
