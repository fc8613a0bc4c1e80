package selector

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubecache/k8s-memcache-selector/internal/meta"
)

// plainCopy is the floor BenchmarkMoves measures the mover against: the
// plainest copy of the keys of srcs that ss gives another owner, with
// none of the mover's guarantees (it would write over a newer value and
// after a delete): list each source once, then, by batches of
// plainBatch keys, read them pipelined at the source, write them
// pipelined at their owners, and delete them pipelined at the source.
// It returns the keys it moved.
func plainCopy(tb testing.TB, ss *ServerList, srcs []string) int {
	tb.Helper()
	conns := map[string]*plainConn{}
	conn := func(addr string) *plainConn {
		if pc := conns[addr]; pc != nil {
			return pc
		}
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			tb.Fatal(err)
		}
		pc := &plainConn{nc: nc, r: bufio.NewReaderSize(nc, 64<<10), w: bufio.NewWriterSize(nc, 64<<10)}
		conns[addr] = pc
		return pc
	}
	defer func() {
		for _, pc := range conns {
			pc.nc.Close()
		}
	}()
	moved := 0
	for _, src := range srcs {
		nc, err := net.Dial("tcp", src)
		if err != nil {
			tb.Fatal(err)
		}
		var keys []string
		err = meta.List(context.Background(), nc, 10*time.Second, func(it meta.Listed) error {
			if a, err := ss.PickServer(it.Key); err == nil && a.String() != src {
				keys = append(keys, it.Key)
			}
			return nil
		})
		nc.Close()
		if err != nil {
			tb.Fatal(err)
		}
		from := conn(src)
		for len(keys) > 0 {
			n := min(plainBatch, len(keys))
			batch := keys[:n]
			keys = keys[n:]
			for _, k := range batch {
				fmt.Fprintf(from.w, "mg %s k f t v q\r\n", k)
			}
			items := from.read(tb)
			byOwner := map[string][]plainItem{}
			for _, it := range items {
				a, _ := ss.PickServer(it.key)
				byOwner[a.String()] = append(byOwner[a.String()], it)
			}
			for addr, its := range byOwner {
				to := conn(addr)
				for _, it := range its {
					fmt.Fprintf(to.w, "ms %s %d F%s T%s q\r\n", it.key, len(it.value), it.flags, it.ttl)
					to.w.Write(it.value)
					to.w.WriteString("\r\n")
				}
				to.read(tb)
			}
			for _, it := range items {
				fmt.Fprintf(from.w, "md %s q\r\n", it.key)
			}
			from.read(tb)
			moved += len(items)
		}
	}
	return moved
}

const plainBatch = 128

type plainConn struct {
	nc net.Conn
	r  *bufio.Reader
	w  *bufio.Writer
}

type plainItem struct {
	key, flags, ttl string
	value           []byte
}

// read ends a batch of quiet requests with mn and reads their replies:
// the values of mg, and nothing of the stores and deletes that succeeded.
func (pc *plainConn) read(tb testing.TB) []plainItem {
	tb.Helper()
	pc.w.WriteString("mn\r\n")
	if err := pc.w.Flush(); err != nil {
		tb.Fatal(err)
	}
	var out []plainItem
	for {
		line, err := pc.r.ReadString('\n')
		if err != nil {
			tb.Fatal(err)
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
			tb.Fatalf("plain copy: an empty line")
		case f[0] == "MN":
			return out
		case f[0] == "VA" && len(f) >= 2:
			n, _ := strconv.Atoi(f[1])
			it := plainItem{value: make([]byte, n+2)}
			if _, err := io.ReadFull(pc.r, it.value); err != nil {
				tb.Fatal(err)
			}
			it.value = it.value[:n]
			for _, fl := range f[2:] {
				switch fl[0] {
				case 'k':
					it.key = fl[1:]
				case 'f':
					it.flags = fl[1:]
				case 't':
					it.ttl = fl[1:]
					if it.ttl == "-1" {
						it.ttl = "0"
					}
				}
			}
			out = append(out, it)
		case f[0] == "EN", f[0] == "NF":
		default:
			tb.Fatalf("plain copy: %q", line)
		}
	}
}
