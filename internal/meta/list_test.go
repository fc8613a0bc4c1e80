package meta

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseListed(t *testing.T) {
	for _, tc := range []struct {
		name string
		line string
		want Listed
		err  string
	}{
		{"memcached 1.6.18", "key=foo exp=1796169600 la=1796169500 cas=7 fetch=no cls=1 size=63", Listed{Key: "foo", Exp: 1796169600, CAS: 7, Size: 63}, ""},
		{"never expires", "key=bar exp=-1 la=1 cas=2 fetch=yes cls=1 size=60", Listed{Key: "bar", Exp: -1, CAS: 2, Size: 60}, ""},
		{"URI-encoded key", "key=user%3A42%2Fname exp=-1 la=1 cas=1 fetch=no cls=1 size=70", Listed{Key: "user:42/name", Exp: -1, CAS: 1, Size: 70}, ""},
		{"unknown field skipped", "key=a exp=5 future=x cas=3", Listed{Key: "a", Exp: 5, CAS: 3}, ""},
		{"no key", "exp=5 cas=3", Listed{}, "without key= and exp="},
		{"no exp", "key=a cas=3", Listed{}, "without key= and exp="},
		{"field without a value", "key=a exp=5 junk", Listed{}, `listing field "junk" without a value`},
		{"bad exp", "key=a exp=soon", Listed{}, `listing field exp="soon"`},
		{"exp below -1", "key=a exp=-2", Listed{}, "below -1"},
		{"bad cas", "key=a exp=1 cas=-1", Listed{}, `listing field cas="-1"`},
		{"bad escape", "key=a%zz exp=1", Listed{}, `listing field key="a%zz"`},
		{"memcached 1.6.45", "key=foo exp=-1 la=1796403991 cas=2 fetch=no cls=1 size=69 flags=5 ", Listed{Key: "foo", Exp: -1, CAS: 2, Size: 69}, ""},
		{"decodes to a space", "key=a%20b exp=1", Listed{Key: "a b", Invalid: true, Exp: 1}, ""},
		{"empty key", "key= exp=1", Listed{Invalid: true, Exp: 1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseListed([]byte(tc.line))
			if tc.err != "" {
				require.ErrorIs(t, err, ErrProtocol)
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func FuzzParseListed(f *testing.F) {
	f.Add([]byte("key=foo exp=1796169600 la=1796169500 cas=7 fetch=no cls=1 size=63"))
	f.Add([]byte("key=user%3A42 exp=-1 la=1 cas=1 fetch=no cls=1 size=70"))
	f.Add([]byte("key=a exp=5 junk"))
	f.Fuzz(func(t *testing.T, line []byte) {
		it, err := ParseListed(line)
		if err != nil {
			require.ErrorIs(t, err, ErrProtocol)
			return
		}
		require.Equal(t, CheckKey(it.Key) != nil, it.Invalid, "a listed key is marked invalid if and only if memcached's text protocol cannot name it")
		require.GreaterOrEqual(t, it.Exp, int64(-1))
	})
}

func TestParseMgdump(t *testing.T) {
	for _, tc := range []struct {
		name string
		line string
		want Listed
		err  string
	}{
		{"a key", "mg foo", Listed{Key: "foo"}, ""},
		{"a binary key", "mg YSBi b", Listed{Key: "a b", Invalid: true}, ""},
		{"base64 of a valid key", "mg Zm9v b", Listed{Key: "foo"}, ""},
		{"unknown flag skipped", "mg foo x", Listed{Key: "foo"}, ""},
		{"not mg", "md foo", Listed{}, "not mg <key>"},
		{"no key", "mg ", Listed{}, "without a key"},
		{"bad base64", "mg !!! b", Listed{}, "base64 key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMgdump([]byte(tc.line))
			if tc.err != "" {
				require.ErrorIs(t, err, ErrProtocol)
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func FuzzParseMgdump(f *testing.F) {
	f.Add([]byte("mg foo"))
	f.Add([]byte("mg YSBi b"))
	f.Add([]byte("mg a b c"))
	f.Fuzz(func(t *testing.T, line []byte) {
		it, err := parseMgdump(line)
		if err != nil {
			require.ErrorIs(t, err, ErrProtocol)
			return
		}
		require.Equal(t, CheckKey(it.Key) != nil, it.Invalid)
	})
}

// List reads every framing a memcached in use answers: mgdump with and
// without memcached 1.6.43's OK line, metadump after a server that does
// not know mgdump refused it, with both line ends and an OK line, and an
// invalid key among valid ones.
func TestListFramings(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mgdump   string // the reply to mgdump
		metadump string // the reply to metadump, if asked
		want     []Listed
	}{
		{"mgdump, 1.6.19 to 1.6.42", "mg foo\r\nmg YSBi b\r\nEN\r\n", "", []Listed{{Key: "foo"}, {Key: "a b", Invalid: true}}},
		{"mgdump, 1.6.43 and later", "OK\r\nmg foo\r\nmg YSBi b\r\nEN\r\n", "", []Listed{{Key: "foo"}, {Key: "a b", Invalid: true}}},
		{"metadump, 1.6.18", "ERROR\r\n", "key=foo exp=-1 la=1 cas=1 fetch=no cls=1 size=69\nkey=a%20b exp=5 la=1 cas=2 fetch=no cls=1 size=65\nEND\r\n",
			[]Listed{{Key: "foo", Exp: -1, CAS: 1, Size: 69}, {Key: "a b", Invalid: true, Exp: 5, CAS: 2, Size: 65}}},
		{"metadump with OK, mgdump refused", "CLIENT_ERROR bad command\r\n", "OK\r\nkey=foo exp=-1 la=1 cas=2 fetch=no cls=1 size=69 flags=5 \nEND\r\n",
			[]Listed{{Key: "foo", Exp: -1, CAS: 2, Size: 69}}},
		{"empty, 1.6.45", "OK\r\nEN\r\n", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					switch line {
					case "lru_crawler mgdump all\r\n":
						nc.Write([]byte(tc.mgdump))
					case "lru_crawler metadump all\r\n":
						nc.Write([]byte(tc.metadump))
					default:
						nc.Write([]byte("ERROR\r\n"))
					}
				}
			})
			nc, err := s.dial(context.Background())
			require.NoError(t, err)
			defer nc.Close()
			var got []Listed
			require.NoError(t, List(context.Background(), nc, time.Second, func(it Listed) error { got = append(got, it); return nil }))
			require.Equal(t, tc.want, got)
		})
	}
}

// A real memcached lists what was set: keys (encoded ones too), their
// expirations and CASes.
func TestListReal(t *testing.T) {
	m := startMemcached(t)
	c := m.conn(t, Options{})
	ctx := context.Background()
	want := map[string]int64{} // key -> TTL set
	for i := range 300 {
		k := fmt.Sprintf("list:%d", i)
		if i%3 == 0 {
			k = fmt.Sprintf("list/%d:ü", i) // encoded by the server
		}
		ttl := int64(0)
		if i%2 == 0 {
			ttl = 100 + int64(i)
		}
		_, err := c.Set(ctx, k, []byte("v"), SetOptions{TTL: int32(ttl)})
		require.NoError(t, err)
		want[k] = ttl
	}
	// A key written in base64 that no text request can name (another
	// client's) is listed, marked invalid, and does not stop the listing.
	raw, err := m.dial(ctx)
	require.NoError(t, err)
	_, err = raw.Write([]byte("ms YSBi 1 b\r\nx\r\n")) // "a b"
	require.NoError(t, err)
	reply := make([]byte, 4)
	_, err = io.ReadFull(raw, reply)
	require.NoError(t, err)
	require.Equal(t, "HD\r\n", string(reply))
	raw.Close()
	want["a b"] = 0
	// A listing right after writes can miss some (research/meta.md):
	// list until every key is seen.
	var got map[string]Listed
	require.Eventually(t, func() bool {
		nc, err := m.dial(ctx)
		require.NoError(t, err)
		defer nc.Close()
		got = map[string]Listed{}
		require.NoError(t, List(ctx, nc, time.Second, func(it Listed) error {
			got[it.Key] = it
			require.Equal(t, it.Key == "a b", it.Invalid, it.Key)
			return nil
		}))
		return len(got) == len(want)
	}, 5*time.Second, 100*time.Millisecond)
	now := time.Now().Unix()
	for k, ttl := range want {
		it, ok := got[k]
		require.True(t, ok, k)
		if k == "a b" {
			continue
		}
		if it.CAS == 0 { // mgdump (1.6.19 and later) lists keys alone
			continue
		}
		if ttl == 0 {
			require.Equal(t, int64(-1), it.Exp, k)
		} else {
			require.InDelta(t, now+ttl, it.Exp, 3, k)
		}
		require.NotZero(t, it.CAS, k)
		require.Positive(t, it.Size, k)
	}
}

// A server whose crawler is disabled refuses the listing with a clear
// error; so does one without a crawler.
func TestListRefused(t *testing.T) {
	t.Run("memcached -o no_lru_crawler", func(t *testing.T) {
		m := startMemcached(t, "-o", "no_lru_crawler")
		nc, err := m.dial(context.Background())
		require.NoError(t, err)
		err = List(context.Background(), nc, time.Second, func(Listed) error { return nil })
		require.ErrorIs(t, err, ErrNoListing)
		t.Log(err)
	})
	for _, tc := range []struct {
		name, reply string
		want        error
	}{
		{"ERROR", "ERROR\r\n", ErrNoListing},
		{"busy", "BUSY currently processing crawler request\r\n", ErrCrawlerBusy},
		{"a line too long", strings.Repeat("x", MaxLineLen+1), ErrProtocol},
		{"garbage", "mg a\r\nwhat\r\n", ErrProtocol},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			s := startFake(t, func(nc net.Conn, br *bufio.Reader) {
				for { // the same to mgdump and to metadump, until the client hangs up
					if _, err := br.ReadString('\n'); err != nil {
						return
					}
					nc.Write([]byte(tc.reply))
				}
			})
			nc, err := s.dial(context.Background())
			require.NoError(t, err)
			err = List(context.Background(), nc, time.Second, func(Listed) error { return nil })
			require.ErrorIs(t, err, tc.want)
			_, werr := nc.Write([]byte("x"))
			require.Error(t, werr, "List closed the connection")
		})
	}
}

// A listing that stalls midway ends at the timeout, and one whose context
// ends stops then; an error from f stops it too. Each closes the
// connection.
func TestListBounded(t *testing.T) {
	stall := func(nc net.Conn, br *bufio.Reader) {
		if _, err := br.ReadString('\n'); err == nil {
			nc.Write([]byte("mg a\r\nmg b"))
			br.ReadString('\n')
		}
	}
	t.Run("timeout", func(t *testing.T) {
		checkGoroutines(t)
		s := startFake(t, stall)
		nc, err := s.dial(context.Background())
		require.NoError(t, err)
		start := time.Now()
		n := 0
		err = List(context.Background(), nc, 100*time.Millisecond, func(Listed) error { n++; return nil })
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		require.Less(t, time.Since(start), time.Second)
		require.Equal(t, 1, n)
	})
	t.Run("context", func(t *testing.T) {
		checkGoroutines(t)
		s := startFake(t, stall)
		nc, err := s.dial(context.Background())
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		err = List(ctx, nc, 10*time.Second, func(Listed) error { return nil })
		require.ErrorIs(t, err, context.Canceled)
		require.Less(t, time.Since(start), time.Second)
	})
	t.Run("f fails", func(t *testing.T) {
		checkGoroutines(t)
		s := startFake(t, stall)
		nc, err := s.dial(context.Background())
		require.NoError(t, err)
		stop := errors.New("enough")
		err = List(context.Background(), nc, time.Second, func(Listed) error { return stop })
		require.ErrorIs(t, err, stop)
	})
}
