package selector

import (
	"context"

	"github.com/bradfitz/gomemcache/memcache"
)

// The methods of *memcache.Client, with its signatures: each is its
// Context form (ops.go, getmulti.go) with context.Background(), bounded by
// the Client's timeout alone, as gomemcache's are.

// Get gets the item for key, as memcache.Client.Get (see GetContext).
func (c *Client) Get(key string) (*memcache.Item, error) {
	return c.GetContext(context.Background(), key)
}

// GetMulti gets the items of keys, as memcache.Client.GetMulti (see
// GetMultiContext).
func (c *Client) GetMulti(keys []string) (map[string]*memcache.Item, error) {
	return c.GetMultiContext(context.Background(), keys)
}

// GetAndTouch gets the item for key and sets its expiration, as
// memcache.Client.GetAndTouch (see GetAndTouchContext).
func (c *Client) GetAndTouch(key string, expiration int32) (*memcache.Item, error) {
	return c.GetAndTouchContext(context.Background(), key, expiration)
}

// Touch sets the expiration of key, as memcache.Client.Touch (see
// TouchContext).
func (c *Client) Touch(key string, seconds int32) error {
	return c.TouchContext(context.Background(), key, seconds)
}

// Set writes item, as memcache.Client.Set (see SetContext).
func (c *Client) Set(item *memcache.Item) error { return c.SetContext(context.Background(), item) }

// Add writes item if its key holds no value, as memcache.Client.Add (see
// AddContext).
func (c *Client) Add(item *memcache.Item) error { return c.AddContext(context.Background(), item) }

// Replace writes item if its key holds a value, as memcache.Client.Replace
// (see ReplaceContext).
func (c *Client) Replace(item *memcache.Item) error {
	return c.ReplaceContext(context.Background(), item)
}

// Append appends item's value to its key's, as memcache.Client.Append (see
// AppendContext).
func (c *Client) Append(item *memcache.Item) error {
	return c.AppendContext(context.Background(), item)
}

// Prepend prepends item's value to its key's, as memcache.Client.Prepend
// (see PrependContext).
func (c *Client) Prepend(item *memcache.Item) error {
	return c.PrependContext(context.Background(), item)
}

// CompareAndSwap writes item if its key's value has not changed since item
// was read, as memcache.Client.CompareAndSwap (see CompareAndSwapContext).
func (c *Client) CompareAndSwap(item *memcache.Item) error {
	return c.CompareAndSwapContext(context.Background(), item)
}

// Delete deletes key, as memcache.Client.Delete (see DeleteContext).
func (c *Client) Delete(key string) error { return c.DeleteContext(context.Background(), key) }

// Increment adds delta to key's value, as memcache.Client.Increment (see
// IncrementContext).
func (c *Client) Increment(key string, delta uint64) (uint64, error) {
	return c.IncrementContext(context.Background(), key, delta)
}

// Decrement subtracts delta from key's value, as memcache.Client.Decrement
// (see DecrementContext).
func (c *Client) Decrement(key string, delta uint64) (uint64, error) {
	return c.DecrementContext(context.Background(), key, delta)
}

// Ping checks that every server answers, as memcache.Client.Ping (see
// PingContext).
func (c *Client) Ping() error { return c.PingContext(context.Background()) }

// FlushAll deletes every item on every server, as memcache.Client.FlushAll
// (see FlushAllContext).
func (c *Client) FlushAll() error { return c.FlushAllContext(context.Background()) }
