package discovery

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// tokenFile is a bearer token read from a file, read again when it is a
// minute old or after a 401. Kubelet replaces projected tokens by swapping a
// symlink, so re-reading by time is what works; file events do not.
type tokenFile struct {
	path string

	mu     sync.Mutex
	token  string
	readAt time.Time
}

// get returns the token, reading the file if the token is stale. If a
// re-read fails, it keeps the last good token.
func (t *tokenFile) get() (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.token != "" && time.Since(t.readAt) < tokenReadPeriod {
		return t.token, nil
	}
	b, err := os.ReadFile(t.path)
	tok := strings.TrimSpace(string(b))
	switch {
	case err == nil && tok == "":
		err = fmt.Errorf("token file %s is empty", t.path)
	case err != nil:
		err = fmt.Errorf("read token: %w", err)
	}
	if err != nil {
		if t.token != "" {
			return t.token, nil
		}
		return "", err
	}
	t.token, t.readAt = tok, time.Now()
	return tok, nil
}

// expire makes the next get read the file again.
func (t *tokenFile) expire() {
	t.mu.Lock()
	t.readAt = time.Time{}
	t.mu.Unlock()
}
