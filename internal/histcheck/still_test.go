package histcheck

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/bradfitz/gomemcache/memcache"
)

// The untouched keys: written once by a schedule, never by the workload,
// and read back at the end, so that only the Client's moves keep the ones
// whose server changed.

// WriteStill writes n new keys through the target, once, with expiration
// exp: the workload never touches them, so only the Client's moves keep
// the ones whose server changes. It returns the keys; CheckStill reads
// them all back.
func (e *Env) WriteStill(n int, exp int32) []string {
	if e.still == nil {
		e.still = map[string]string{}
	}
	items := make([]*memcache.Item, n)
	keys := make([]string, n)
	for i := range items {
		keys[i] = stillKey(e.stillN)
		e.stillN++
		v := e.d.value()
		e.still[keys[i]] = v
		items[i] = &memcache.Item{Key: keys[i], Value: []byte(v), Expiration: exp}
	}
	err := setAll(e.d.t, items)
	e.Step("wrote %d untouched keys: %v", n, err)
	return keys
}

// readAll reads keys through t, and returns the ones found.
func readAll(t Target, keys []string) map[string]*memcache.Item {
	found := map[string]*memcache.Item{}
	for len(keys) > 0 {
		batch := keys[:min(len(keys), 100)]
		keys = keys[len(batch):]
		// A batch that failed (a timeout on a loaded machine) is read
		// again: a key not found is one a read that succeeded missed.
		for try := 0; len(batch) > 0 && try < 5; try++ {
			items, err := t.GetMulti(batch)
			for k, it := range items {
				found[k] = it
			}
			if err == nil {
				break
			}
			batch = slices.DeleteFunc(slices.Clone(batch), func(k string) bool { return found[k] != nil })
		}
	}
	return found
}

// CheckStill reads back every key WriteStill wrote since the last check,
// counts the ones found with their value, and returns them. It reads
// through a new client of the target's kind, which has no past rings to
// hand keys off from: a key is found where it is, at its server.
func (e *Env) CheckStill(name string, floor float64) ([]string, error) {
	keys := make([]string, 0, len(e.still))
	for k := range e.still {
		keys = append(keys, k)
	}
	t, closeT, err := e.newTarget()
	if err != nil {
		return nil, err
	}
	defer closeT()
	var kept []string
	for k, it := range readAll(t, keys) {
		if string(it.Value) == e.still[k] {
			kept = append(kept, k)
		}
	}
	e.Count(name, len(kept), len(keys), floor)
	e.still = nil
	return kept, nil
}

// setAll sets items through t, a few at once, and returns the errors.
func setAll(t interface{ Set(*memcache.Item) error }, items []*memcache.Item) error {
	const setters = 8
	errs := make([]error, setters)
	var wg sync.WaitGroup
	for s := range setters {
		wg.Go(func() {
			for i := s; i < len(items); i += setters {
				if err := t.Set(items[i]); err != nil && errs[s] == nil {
					errs[s] = fmt.Errorf("set %s: %w", items[i].Key, err)
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
