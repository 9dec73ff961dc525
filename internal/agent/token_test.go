package agent

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

func TestTokenFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	os.WriteFile(path, []byte("first.token.value\n"), 0o600)
	var changes atomic.Int32
	tf := &TokenFile{Path: path, OnChange: func() { changes.Add(1) }}
	if tok, err := tf.Token(); err != nil || tok != "first.token.value" {
		t.Fatalf("%q %v", tok, err)
	}
	// Rotated the way a Kubernetes secret volume or an operator does it:
	// a new file renamed over the old one.
	tmp := filepath.Join(dir, "token.new")
	os.WriteFile(tmp, []byte("second.token.value\n"), 0o600)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if tok, err := tf.Token(); err != nil || tok != "second.token.value" {
		t.Fatalf("after rotation: %q %v", tok, err)
	}
	// Rewritten in place, to a value of another length.
	os.WriteFile(path, []byte("third.token.value.longer"), 0o600)
	if tok, err := tf.Token(); err != nil || tok != "third.token.value.longer" {
		t.Fatalf("after rewrite: %q %v", tok, err)
	}
	if changes.Load() != 2 {
		t.Errorf("OnChange called %d times, want 2", changes.Load())
	}
	for content, want := range map[string]string{
		"":                                  "is empty",
		" \n":                               "is empty",
		"two words":                         "more than one word",
		strings.Repeat("x", maxTokenFile+1): "larger than",
	} {
		os.WriteFile(path, []byte(content), 0o600)
		if _, err := (&TokenFile{Path: path}).Token(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.20q: %v, want %q", content, err, want)
		}
	}
	if _, err := (&TokenFile{Path: filepath.Join(dir, "missing")}).Token(); err == nil {
		t.Error("a missing file gave a token")
	}
}
