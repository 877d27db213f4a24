package outage

import (
	"context"
	"net"
	"time"

	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/redis/go-redis/v9"
)

// DialOf returns a Dial with client's own dialer, network and address when
// client is a *redis.Client (anything with its Options), else nil.
func DialOf(client any) Dial {
	c, ok := client.(interface{ Options() *redis.Options })
	if !ok {
		return nil
	}
	o := c.Options()
	if o == nil || o.Dialer == nil {
		return nil
	}
	dialer, network, addr := o.Dialer, o.Network, o.Addr
	return func(ctx context.Context) (net.Conn, error) { return dialer(ctx, network, addr) }
}

// Accepting returns nil once a dial does not refuse (it connects, or fails
// otherwise: a time-out is no refusal), dialling again every Retry while
// the server refuses; or ctx's error when ctx ends first. Work that may
// wait for a server to come back (a release after its call left) waits
// here rather than in go-redis, whose failed dials open its dial breaker
// (PoolSize of them, for the client's life: then every new connection is
// refused for up to a second after the server is back).
func Accepting(ctx context.Context, dial Dial) error {
	for {
		conn, err := dial(ctx)
		if conn != nil {
			_ = conn.Close()
		}
		if err == nil || !reach.Unreachable(err) {
			return nil
		}
		t := time.NewTimer(Retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
