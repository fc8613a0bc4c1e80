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
// happened, how long it took, the servers in the ring as it began, and for
// each path (a load) the errors and the hit rate of its requests meanwhile.
// A line above the header names the paths. It counts from its creation; it
// prints its header with the first row.
type trafficTable struct {
	o      *output
	loads  []*load
	ss     *selector.ServerList
	cols   []column
	extra  []func() string // the values of the columns withColumn added
	header bool
}

// Widths of the traffic table's columns: the step, time and servers, then
// errors and hit rate per path.
const (
	stepWidth   = 30
	errorsWidth = 8
	rateWidth   = 8
)

func (o *output) trafficTable(first string, ss *selector.ServerList, loads ...*load) *trafficTable {
	cols := []column{{first, -stepWidth}, {"time", 5}, {"servers", 7}}
	for _, l := range loads {
		l.next()
		cols = append(cols, column{"errors", errorsWidth}, column{"hit rate", rateWidth})
	}
	return &trafficTable{o: o, loads: loads, ss: ss, cols: cols}
}

// withColumn adds a column after the last path's errors and hit rate, under
// that path's name, for a figure the loads do not count: value returns it
// when a row ends, for the time since the previous row (or since skip);
// a live row leaves it blank.
func (t *trafficTable) withColumn(name string, width int, value func() string) *trafficTable {
	t.cols = append(t.cols, column{name, width})
	t.extra = append(t.extra, value)
	return t
}

// row runs f under the loads and prints a row for the time since the
// previous one, labeled with label and what f returns: live while f runs
// (on a terminal), then final. It returns the window that ended of each
// load, in the order of the loads.
func (t *trafficTable) row(label string, f func() (string, error)) ([]*window, error) {
	if !t.header {
		t.printHeader()
		t.header = true
	}
	servers := len(t.ss.Servers())
	line := func(label string, ws []*window, took time.Duration, extra []string) string {
		values := []any{label, seconds(took), servers}
		for _, w := range ws {
			values = append(values, count(w.errors()), percent(w.hitRate()))
		}
		for _, e := range extra {
			values = append(values, e)
		}
		return row(t.cols, values...)
	}
	answer, err := t.o.during(func() string {
		ws := make([]*window, len(t.loads))
		for i, l := range t.loads {
			ws[i] = l.current()
		}
		return line(label+" ...", ws, time.Since(ws[0].start), make([]string, len(t.extra)))
	}, f)
	if err != nil {
		return nil, err
	}
	ws := make([]*window, len(t.loads))
	for i, l := range t.loads {
		ws[i] = l.next()
	}
	for _, w := range ws {
		w.settle()
	}
	extra := make([]string, len(t.extra))
	for i, value := range t.extra {
		extra[i] = value()
	}
	t.o.say("%s", line(strings.TrimSpace(label+" "+answer), ws, ws[0].took, extra))
	return ws, nil
}

// skip runs f between two rows, under the loads: its time counts in no
// row, and the next one counts from when it returns.
func (t *trafficTable) skip(f func() error) error {
	if err := f(); err != nil {
		return err
	}
	for _, l := range t.loads {
		l.next()
	}
	for _, value := range t.extra {
		value()
	}
	return nil
}

// printHeader prints the names of the paths, each right-aligned over its
// errors and hit rate (the last also over the columns withColumn added),
// and the columns' names.
func (t *trafficTable) printHeader() {
	paths := []column{{"", -(stepWidth + 2 + 5 + 2 + 7)}}
	names := []any{""}
	for _, l := range t.loads {
		paths = append(paths, column{"", errorsWidth + 2 + rateWidth})
		names = append(names, l.name)
	}
	for _, c := range t.cols[len(t.cols)-len(t.extra):] { // the last path's
		paths[len(paths)-1].width += 2 + c.width
	}
	t.o.say("%s", row(paths, names...))
	t.o.header(t.cols)
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

// plural formats n things, and a verb after them if there is one: 1 error,
// 2 errors, 1 request failed.
func plural(n int64, thing, verb string) string {
	s := count(n) + " " + thing
	if n != 1 {
		s += "s"
	}
	return strings.TrimSpace(s + " " + verb)
}

func percent(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func seconds(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }
