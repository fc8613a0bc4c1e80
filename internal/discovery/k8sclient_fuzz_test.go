package discovery

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzWatchStream: any bytes from a watch response end in events and then
// io.EOF or an error, without a panic, and every event decoded is within
// maxEventBytes.
func FuzzWatchStream(f *testing.F) {
	f.Add(`{"type":"ADDED","object":{"metadata":{"name":"a"}}}` + "\n" + `{"type":"BOOKMARK","object":{}}`)
	f.Add(`{"type":"ERROR","object":{"kind":"Status","code":410}}`)
	f.Add(`{"type": ADDED}`)
	f.Add(`{"type":"ADDED","object":{}}{"type":"MODI`)
	f.Add("\n\n \t")
	f.Fuzz(func(t *testing.T, body string) {
		s := newWatchStream(io.NopCloser(strings.NewReader(body)))
		for range len(body) + 1 {
			ev, err := s.next()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					require.ErrorContains(t, err, "decode watch event")
				}
				return
			}
			require.LessOrEqual(t, len(ev.Object), maxEventBytes)
			s.more()
		}
		t.Fatal("more events than bytes")
	})
}
