package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	selector "github.com/kubecache/k8s-memcache-selector"
)

// output writes the demo's story: chapters, sentences and aligned tables.
// On a terminal, a table row can be live: redrawn while its step runs.
type output struct {
	w   io.Writer
	tty bool
}

func newOutput(f *os.File) *output {
	fi, err := f.Stat()
	return &output{w: f, tty: err == nil && fi.Mode()&os.ModeCharDevice != 0}
}

func (o *output) chapter(format string, args ...any) {
	title := fmt.Sprintf(format, args...)
	if o.tty {
		title = "\x1b[1m" + title + "\x1b[0m"
	}
	fmt.Fprintf(o.w, "\n%s\n", title)
}

// say writes an indented line.
func (o *output) say(format string, args ...any) {
	fmt.Fprintf(o.w, "  "+format+"\n", args...)
}

// column is a table column; a negative width aligns it left.
type column struct {
	name  string
	width int
}

func (o *output) header(cols []column) {
	names := make([]any, len(cols))
	for i, c := range cols {
		names[i] = c.name
	}
	o.say("%s", row(cols, names...))
}

// row formats values in cols.
func row(cols []column, values ...any) string {
	var b strings.Builder
	for i, c := range cols {
		if i > 0 {
			b.WriteString("  ")
		}
		fmt.Fprintf(&b, "%*v", c.width, values[i])
	}
	return strings.TrimRight(b.String(), " ")
}

// during runs f. On a terminal, meanwhile, it shows the line live()
// returns, redrawn ten times a second; it erases it when f returns.
func (o *output) during(live func() string, f func() (string, error)) (string, error) {
	if !o.tty {
		return f()
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			fmt.Fprintf(o.w, "\r  %s\x1b[K", live())
			select {
			case <-stop:
				fmt.Fprint(o.w, "\r\x1b[K")
				return
			case <-tick.C:
			}
		}
	}()
	defer func() {
		close(stop)
		<-stopped
	}()
	return f()
}

// trafficTable prints a row per step of a story told under traffic: what
// happened, how long it took, the servers in the ring as it began, and the
// requests, errors and hit rate of the load meanwhile. It counts from its
// creation; it prints its header with the first row.
type trafficTable struct {
	o      *output
	load   *load
	ss     *selector.ServerList
	cols   []column
	header bool
}

func (o *output) trafficTable(first string, load *load, ss *selector.ServerList) *trafficTable {
	load.next()
	return &trafficTable{o: o, load: load, ss: ss, cols: []column{
		{first, -34}, {"time", 5}, {"servers", 7}, {"requests", 8}, {"errors", 6}, {"hit rate", 8},
	}}
}

// row runs f under the load and prints a row for the time since the
// previous one, labeled with label and what f returns: live while f runs
// (on a terminal), then final.
func (t *trafficTable) row(label string, f func() (string, error)) (*window, error) {
	if !t.header {
		t.o.header(t.cols)
		t.header = true
	}
	servers := len(t.ss.Servers())
	line := func(label string, w *window, took time.Duration) string {
		return row(t.cols, label, seconds(took), servers, count(w.requests()), count(w.errors()), percent(w.hitRate()))
	}
	answer, err := t.o.during(func() string {
		w := t.load.current()
		return line(label+" ...", w, time.Since(w.start))
	}, f)
	if err != nil {
		return nil, err
	}
	w := t.load.next()
	t.o.say("%s", line(strings.TrimSpace(label+" "+answer), w, w.took))
	return w, nil
}

// count formats n with thousands separators: 10,000.
func count[T int | int64](n T) string {
	if n < 0 {
		return "-" + count(-n)
	}
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func percent(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func seconds(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }
