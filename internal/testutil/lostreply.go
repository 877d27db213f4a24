package testutil

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// A LostReply is a network fault between go-redis clients and Redis: the
// reply to a chosen command is lost after Redis ran the command. Clients use
// it as their Options.Dialer (Options, Backend.LostReplyClient); it passes
// everything through until a test arms it (Drop, DropNth, DropEvery). Then
// the next command that the Match accepts is sent to Redis as usual, its
// reply is read off the wire and thrown away, and the connection is closed:
// the client sees io.EOF, as when the server or the network drops a
// connection, and go-redis (MaxRetries 3 by default) sends the command again
// on a new connection. What the test then checks is what a retry of a write
// whose first run landed does.
//
// A reply is dropped only once Redis has sent it, so the command ran before
// the client sees the fault. A NOSCRIPT error is not dropped (the script did
// not run: go-redis's Script.Run then sends EVAL, which the fault may drop
// instead), so a test need not know whether the script cache is warm.
//
// A test must check that its fault fired (Dropped, ExpectDropped): a fault
// that never fired proves nothing. NewLostReply fails the test when it ends
// with a drop still armed. Safe for concurrent use.
type LostReply struct {
	mu      sync.Mutex
	match   Match
	skip    int // matching replies to let through before the next drop
	left    int // drops to make; < 0: every match until Disarm
	dropped []DroppedReply
	sent    [][]string
}

// A DroppedReply is one reply a LostReply threw away.
type DroppedReply struct {
	// Args is the command, its name first.
	Args []string
	// Reply is the lost reply, as RESP.
	Reply string
}

// A Match picks commands by their arguments as sent (the name first, in the
// case the client sent it). It is called with the LostReply's lock held.
type Match func(args []string) bool

// NewLostReply returns a fault with nothing armed. When t ends, a drop that
// is still armed fails t: the scenario never sent what the test meant to
// lose.
func NewLostReply(t testing.TB) *LostReply {
	f := &LostReply{}
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.left > 0 {
			t.Errorf("lost-reply fault: %d drop(s) armed but never fired (no command matched after %d let through)", f.left, f.skip)
		}
	})
	return f
}

// Options returns go-redis's default options for addr, with f as the dialer:
// MaxRetries and every timeout as go-redis sets them.
func (f *LostReply) Options(addr string) *redis.Options {
	return &redis.Options{Addr: addr, Dialer: f.Dial}
}

// Dial is an Options.Dialer: it dials addr and wraps the connection.
func (f *LostReply) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &lostReplyConn{Conn: c, f: f}, nil
}

// Drop arms f to lose the reply to the next command that match accepts.
func (f *LostReply) Drop(match Match) { f.arm(match, 0, 1) }

// DropNth arms f to lose the reply to the nth command (from 1) that match
// accepts from now; the n-1 before it are answered.
func (f *LostReply) DropNth(n int, match Match) {
	if n < 1 {
		panic(fmt.Sprintf("testutil: DropNth(%d)", n))
	}
	f.arm(match, n-1, 1)
}

// DropEvery arms f to lose the reply to every command that match accepts,
// retries included, until Disarm: a call that go-redis gives up on.
func (f *LostReply) DropEvery(match Match) { f.arm(match, 0, -1) }

func (f *LostReply) arm(match Match, skip, times int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.match, f.skip, f.left = match, skip, times
}

// Disarm stops f from dropping anything more.
func (f *LostReply) Disarm() { f.arm(nil, 0, 0) }

// Dropped returns how many replies f has dropped.
func (f *LostReply) Dropped() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.dropped)
}

// DroppedReplies returns the replies f has dropped, in order.
func (f *LostReply) DroppedReplies() []DroppedReply {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.dropped)
}

// ExpectDropped fails t unless f has dropped exactly n replies so far.
func (f *LostReply) ExpectDropped(t testing.TB, n int) {
	t.Helper()
	if got := f.DroppedReplies(); len(got) != n {
		t.Errorf("lost-reply fault dropped %d replies, want %d: %v", len(got), n, got)
	}
}

// Sent returns how many commands that match accepts went through f's
// connections (each retry counts, and so do the set-up commands of every new
// connection: HELLO, CLIENT SETINFO).
func (f *LostReply) Sent(match Match) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, args := range f.sent {
		if match(args) {
			n++
		}
	}
	return n
}

// watches reports whether a command just written is one to follow: f is
// armed and match accepts it.
func (f *LostReply) watches(args []string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent = append(f.sent, args)
	return f.left != 0 && f.match(args)
}

// lose decides, once Redis answered a followed command with reply, whether
// the reply is lost.
func (f *LostReply) lose(args []string, reply []byte) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.left == 0 || !f.match(args):
		return false // disarmed (or re-armed for something else) meanwhile
	case bytes.HasPrefix(reply, []byte("-NOSCRIPT")):
		return false // did not run
	case f.skip > 0:
		f.skip--
		return false
	}
	if f.left > 0 {
		f.left--
	}
	f.dropped = append(f.dropped, DroppedReply{Args: args, Reply: string(reply)})
	return true
}

// Named matches commands by name, in any case ("evalsha", "SET").
func Named(names ...string) Match {
	return func(args []string) bool {
		return len(args) > 0 && slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(n, args[0]) })
	}
}

// AnyCommand matches every command, connection set-up ones included.
func AnyCommand(args []string) bool { return true }

// isScript reports whether args run a script: EVAL, EVALSHA or their _RO
// forms, with at least the script and the number of keys.
func isScript(args []string) bool {
	return len(args) >= 3 && Named("eval", "evalsha", "eval_ro", "evalsha_ro")(args)
}

// Scripts matches commands that run a script (EVAL, EVALSHA and their _RO
// forms) whose keys and arguments, taken together, contain every one of
// subs (each in some key or argument, not in the script itself): for
// example the name of a key that only one kind of call passes.
func Scripts(subs ...string) Match {
	return func(args []string) bool {
		if !isScript(args) {
			return false
		}
		for _, s := range subs {
			if !slices.ContainsFunc(args[3:], func(a string) bool { return strings.Contains(a, s) }) {
				return false
			}
		}
		return true
	}
}

// ScriptHash matches commands that run the script whose SHA1 is sha (as
// redis.Script.Hash returns it), by hash (EVALSHA) or by body (EVAL).
func ScriptHash(sha string) Match {
	return func(args []string) bool {
		if !isScript(args) {
			return false
		}
		if strings.HasPrefix(strings.ToLower(args[0]), "evalsha") {
			return strings.EqualFold(args[1], sha)
		}
		sum := sha1.Sum([]byte(args[1]))
		return hex.EncodeToString(sum[:]) == strings.ToLower(sha)
	}
}

// All matches commands that every one of ms matches.
func All(ms ...Match) Match {
	return func(args []string) bool {
		for _, m := range ms {
			if !m(args) {
				return false
			}
		}
		return true
	}
}

// lostReplyConn is one connection of a LostReply. go-redis writes a command
// (or a pipeline) on a connection and then reads all of its replies: the
// commands written since the last read are the ones whose replies come next,
// in order. (A pub/sub connection may be read while it is written to: the
// state shared by the two sides is under mu; rbuf belongs to the reader.)
type lostReplyConn struct {
	net.Conn
	f *LostReply

	mu       sync.Mutex
	wbuf     []byte // written bytes not yet parsed into a whole command
	opaque   bool   // the client wrote something that is not RESP: parse no more
	batch    int    // commands written since the last read
	readSeen bool   // a read happened since the last write
	watch    int    // 1-based place in the batch of the followed command; 0: none
	watched  []string

	rbuf []byte // bytes read from Redis, not yet returned to the client
	lost atomic.Bool
}

func (c *lostReplyConn) Write(p []byte) (int, error) {
	if c.lost.Load() {
		return 0, net.ErrClosed
	}
	c.mu.Lock()
	if c.readSeen {
		c.readSeen, c.batch, c.watch = false, 0, 0
	}
	if !c.opaque {
		c.wbuf = append(c.wbuf, p...)
		for {
			args, n, err := parseCommand(c.wbuf)
			if err != nil {
				c.opaque, c.wbuf = true, nil
				break
			}
			if n == 0 {
				break
			}
			c.wbuf = c.wbuf[n:]
			c.batch++
			if c.f.watches(args) && c.watch == 0 {
				c.watch, c.watched = c.batch, args
			}
		}
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *lostReplyConn) Read(p []byte) (int, error) {
	if c.lost.Load() {
		return 0, io.EOF
	}
	c.mu.Lock()
	c.readSeen = true
	k, args := c.watch, c.watched
	c.watch = 0
	c.mu.Unlock()
	if k > 0 {
		start, end, err := c.readReplies(k)
		if err != nil {
			return 0, err
		}
		if c.f.lose(args, c.rbuf[start:end]) {
			c.lost.Store(true)
			c.rbuf = nil
			_ = c.Conn.Close()
			return 0, io.EOF
		}
	}
	if len(c.rbuf) > 0 {
		n := copy(p, c.rbuf)
		c.rbuf = c.rbuf[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// readReplies reads from Redis into rbuf until it holds k whole replies
// (push messages aside), and returns where the k-th lies in rbuf.
func (c *lostReplyConn) readReplies(k int) (start, end int, err error) {
	var chunk [4096]byte
	for {
		pos, seen := 0, 0
		for {
			n, err := respValue(c.rbuf[pos:])
			if err != nil {
				return 0, 0, fmt.Errorf("lost-reply fault: reply: %w", err)
			}
			if n == 0 {
				break
			}
			if c.rbuf[pos] != '>' { // a push is not a reply
				seen++
				if seen == k {
					return pos, pos + n, nil
				}
			}
			pos += n
		}
		n, err := c.Conn.Read(chunk[:])
		c.rbuf = append(c.rbuf, chunk[:n]...)
		if err != nil {
			if n > 0 && errors.Is(err, io.EOF) {
				continue // parse what came before the end
			}
			return 0, 0, err
		}
	}
}

// errRESP reports bytes that are not RESP.
var errRESP = errors.New("not RESP")

// respLine returns the text after the type byte of b's first line, and the
// line's length with its CRLF; n is 0 when the line is incomplete.
func respLine(b []byte) (text string, n int) {
	i := bytes.Index(b, []byte("\r\n"))
	if i < 0 {
		return "", 0
	}
	return string(b[1:i]), i + 2
}

// respValue returns the length of the RESP2 or RESP3 value at the start of
// b, or 0 when b does not hold all of it yet.
func respValue(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	text, n := respLine(b)
	if n == 0 {
		return 0, nil
	}
	switch b[0] {
	case '+', '-', ':', ',', '(', '#', '_':
		return n, nil
	case '$', '!', '=': // bulk string, bulk error, verbatim string
		size, err := strconv.Atoi(text)
		if err != nil {
			return 0, fmt.Errorf("%w: length %q", errRESP, text)
		}
		if size < 0 {
			return n, nil
		}
		if len(b) < n+size+2 {
			return 0, nil
		}
		return n + size + 2, nil
	case '*', '~', '>', '%', '|': // array, set, push, map, attribute
		count, err := strconv.Atoi(text)
		if err != nil {
			return 0, fmt.Errorf("%w: count %q", errRESP, text)
		}
		if b[0] == '%' || b[0] == '|' {
			count *= 2
		}
		if b[0] == '|' {
			count++ // an attribute comes before the value it describes
		}
		for range max(count, 0) {
			m, err := respValue(b[n:])
			if err != nil || m == 0 {
				return 0, err
			}
			n += m
		}
		return n, nil
	}
	return 0, fmt.Errorf("%w: type byte %q", errRESP, b[0])
}

// parseCommand reads the command at the start of b: a RESP array of bulk
// strings, as go-redis writes every command. n is 0 when b does not hold
// all of it yet.
func parseCommand(b []byte) (args []string, n int, err error) {
	if len(b) == 0 {
		return nil, 0, nil
	}
	if b[0] != '*' {
		return nil, 0, fmt.Errorf("%w: command starts with %q", errRESP, b[0])
	}
	text, n := respLine(b)
	if n == 0 {
		return nil, 0, nil
	}
	count, err := strconv.Atoi(text)
	if err != nil || count < 0 {
		return nil, 0, fmt.Errorf("%w: command count %q", errRESP, text)
	}
	args = make([]string, 0, count)
	for range count {
		if n >= len(b) {
			return nil, 0, nil
		}
		if b[n] != '$' {
			return nil, 0, fmt.Errorf("%w: argument starts with %q", errRESP, b[n])
		}
		text, m := respLine(b[n:])
		if m == 0 {
			return nil, 0, nil
		}
		size, err := strconv.Atoi(text)
		if err != nil || size < 0 {
			return nil, 0, fmt.Errorf("%w: argument length %q", errRESP, text)
		}
		if len(b) < n+m+size+2 {
			return nil, 0, nil
		}
		args = append(args, string(b[n+m:n+m+size]))
		n += m + size + 2
	}
	return args, n, nil
}

// LostReplyClient returns a client of the backend with go-redis's default
// options (o, if not nil, with Addr and Dialer set here), through a new
// LostReply; t closes the client when it ends.
func (b *Backend) LostReplyClient(t testing.TB, o *redis.Options) (*redis.Client, *LostReply) {
	f := NewLostReply(t)
	if o == nil {
		o = &redis.Options{}
	}
	o.Addr, o.Dialer = b.addr, f.Dial
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c, f
}
