package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// maxTokenFile bounds what is read of a token file: the server refuses
// tokens over 16 KiB anyway.
const maxTokenFile = 64 << 10

// TokenFile is a bearer token kept in a file (REGISTRY_TOKEN_FILE): a
// container secret, or a file an operator replaces to rotate the token.
// Token reads the file again whenever it changed (size, modification time
// or the file itself, as when a Kubernetes secret volume swaps its link),
// so a rotated token is used from the next request on, with no restart.
// It is safe for concurrent use.
type TokenFile struct {
	Path string
	// OnChange, if set, is called after a changed file was read.
	OnChange func()

	mu    sync.Mutex
	token string
	seen  fileStamp
}

type fileStamp struct {
	size    int64
	modTime time.Time
	file    os.FileInfo // for os.SameFile: a replaced file is another file
}

// Token returns the token in the file, read again if the file changed
// since the last call. Surrounding white space (a trailing newline) is
// dropped; an empty file is an error, as is one larger than 64 KiB.
func (t *TokenFile) Token() (string, error) {
	fi, err := os.Stat(t.Path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.token != "" && t.seen.file != nil && os.SameFile(t.seen.file, fi) &&
		fi.Size() == t.seen.size && fi.ModTime().Equal(t.seen.modTime) {
		return t.token, nil
	}
	tok, err := readToken(t.Path)
	if err != nil {
		return "", err
	}
	changed := t.token != "" && tok != t.token
	t.token = tok
	t.seen = fileStamp{size: fi.Size(), modTime: fi.ModTime(), file: fi}
	if changed && t.OnChange != nil {
		t.OnChange()
	}
	return tok, nil
}

func readToken(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if len(b) > maxTokenFile {
		return "", fmt.Errorf("token file %s is larger than %d bytes; it should hold one token", path, maxTokenFile)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	if strings.ContainsAny(tok, " \t\r\n") {
		return "", errors.New("token file " + path + " holds more than one word; it should hold the token alone")
	}
	return tok, nil
}
