package reliability

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// A Toxi is a toxiproxy (github.com/Shopify/toxiproxy/v2) running inside the
// test binary, between clients and one upstream Redis, both on loopback. No
// toxiproxy server or HTTP API is involved: toxics are added and removed
// through the library. Clients that dial Addr reach the upstream through it;
// toxics (latency, timeout, reset_peer, ...) and Down/Up disturb the network
// in between, while a client of the upstream itself sees the truth.
type Toxi struct {
	// Addr is the 127.0.0.1:port the proxy listens on; it stays the same
	// across Down and Up.
	Addr  string
	proxy *toxiproxy.Proxy
}

// StartToxi starts a proxy to upstream (a host:port on loopback) and stops it,
// closing every connection through it, when t ends.
func StartToxi(t testing.TB, upstream string) *Toxi {
	t.Helper()
	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(api, strings.ReplaceAll(t.Name(), "/", "_"), "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("start toxiproxy to %s: %v", upstream, err)
	}
	x := &Toxi{Addr: p.Listen, proxy: p}
	t.Cleanup(p.Stop)
	return x
}

// Client returns a client that reaches the upstream through the proxy (o may
// be nil; its Addr is set here), closed when t ends.
func (x *Toxi) Client(t testing.TB, o *redis.Options) *redis.Client {
	if o == nil {
		o = &redis.Options{}
	}
	o.Addr = x.Addr
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// Down stops the proxy: it stops listening (new dials are refused) and closes
// every connection through it, as when a network link or a host goes away.
func (x *Toxi) Down() { x.proxy.Stop() }

// Up starts the proxy again on the same address after Down.
func (x *Toxi) Up(t testing.TB) {
	t.Helper()
	if err := x.proxy.Start(); err != nil {
		t.Fatalf("restart toxiproxy on %s: %v", x.Addr, err)
	}
}

// AddToxic adds a toxic of type typ ("latency", "timeout", "reset_peer",
// "bandwidth", "slicer", "limit_data", "slow_close") named name to one
// direction of the proxy: stream "upstream" (client to Redis: requests) or
// "downstream" (Redis to client: replies). attrs are the toxic's attributes
// as toxiproxy's JSON API spells them, e.g. {"latency": 150} in ms. The toxic
// applies to every connection, open or future, with toxicity 1.
func (x *Toxi) AddToxic(t testing.TB, name, typ, stream string, attrs map[string]any) {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.proxy.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		t.Fatalf("add toxic %s (%s, %s): %v", name, typ, stream, err)
	}
}

// RemoveToxic removes the toxic called name.
func (x *Toxi) RemoveToxic(t testing.TB, name string) {
	t.Helper()
	if err := x.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
		t.Fatalf("remove toxic %s: %v", name, err)
	}
}

// Latency delays the data of one stream by d, plus or minus jitter, and
// returns the toxic's name for RemoveToxic.
func (x *Toxi) Latency(t testing.TB, stream string, d, jitter time.Duration) string {
	t.Helper()
	name := "latency_" + stream
	x.AddToxic(t, name, "latency", stream, map[string]any{"latency": d.Milliseconds(), "jitter": jitter.Milliseconds()})
	return name
}

// Blackhole drops all data of one stream and never closes the connections
// (toxiproxy's timeout toxic with timeout 0): requests or replies vanish, and
// only the client's own timeouts end its calls. It returns the toxic's name.
func (x *Toxi) Blackhole(t testing.TB, stream string) string {
	t.Helper()
	name := "timeout_" + stream
	x.AddToxic(t, name, "timeout", stream, map[string]any{"timeout": 0})
	return name
}

// ResetPeer resets every connection as soon as data arrives on one stream
// (toxiproxy's reset_peer toxic: TCP RST on connections opened after it was
// added, an abrupt close on earlier ones); the data is dropped. On
// "downstream" a request reaches Redis and runs, and its reply is lost.
// It returns the toxic's name.
func (x *Toxi) ResetPeer(t testing.TB, stream string) string {
	t.Helper()
	name := "reset_peer_" + stream
	x.AddToxic(t, name, "reset_peer", stream, map[string]any{"timeout": 0})
	return name
}
