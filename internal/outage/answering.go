package outage

import (
	"context"
	"net"
	"time"

	"github.com/funnelguard/funnelguard/internal/ctxcall"
	"github.com/funnelguard/funnelguard/internal/reach"
	"github.com/redis/go-redis/v9"
)

// DialOf returns a Dial with client's own dialer, network and address when
// client is a *redis.Client (anything with its Options), so that custom
// dialers, TLS and test dialers agree with it; else nil.
func DialOf(client any) Dial {
	c, ok := client.(interface{ Options() *redis.Options })
	if !ok || c.Options() == nil || c.Options().Dialer == nil {
		return nil
	}
	o := c.Options()
	dialer, network, addr := o.Dialer, o.Network, o.Addr
	return func(ctx context.Context) (net.Conn, error) { return dialer(ctx, network, addr) }
}

// Answering returns nil once the server answers a PING on a connection of
// its own (a dial alone is no test: the kernel accepts a hung server's
// connections), or a dial fails for good (TLS, a name); it tries again
// every Retry until ctx ends. A release after its call left waits here,
// not in go-redis, whose failed dials open its dial breaker.
func Answering(ctx context.Context, dial Dial) error {
	for {
		if answers(ctx, dial) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(Retry):
		}
	}
}

// AnswerBound is how long Answering waits for a connection and the reply to
// its PING before it tries again.
const AnswerBound = 250 * time.Millisecond

// ping is PING as a RESP array, which every server and proxy reads.
var ping = []byte("*1\r\n$4\r\nPING\r\n")

// answers dials, sends PING and reports whether a reply (even an error
// such as NOAUTH) began within AnswerBound, or the dial failed for a
// reason that waiting will not mend.
func answers(ctx context.Context, dial Dial) bool {
	ctx, cancel := context.WithTimeout(ctx, AnswerBound)
	defer cancel()
	conn, err := dial(ctx)
	if err != nil {
		return !reach.Unreachable(err) && ctx.Err() == nil && !ctxcall.TimedOut(err)
	}
	defer conn.Close()
	d, _ := ctx.Deadline()
	_ = conn.SetDeadline(d)
	if _, err := conn.Write(ping); err != nil {
		return false
	}
	var b [1]byte
	_, err = conn.Read(b[:])
	return err == nil
}
