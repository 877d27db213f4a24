package servercheck_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/funnelguard/funnelguard/internal/testutil"
	"github.com/funnelguard/funnelguard/servercheck"
	"github.com/redis/go-redis/v9"
)

// policies are every maxmemory-policy of Redis 7 and Valkey 8.
var policies = []string{
	"noeviction",
	"allkeys-lru", "allkeys-lfu", "allkeys-random",
	"volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl",
}

const mb100 = 100 << 20

// configSet sets a server's parameter; the test owns the server.
func configSet(t testing.TB, c *redis.Client, param, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.ConfigSet(ctx, param, value).Err(); err != nil {
		t.Fatalf("CONFIG SET %s %s: %v", param, value, err)
	}
}

// check runs Check with a deadline of d.
func check(t testing.TB, c redis.UniversalClient, d time.Duration) ([]servercheck.Finding, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return servercheck.Check(ctx, c)
}

// Every policy with and without a memory limit, on a server of the test's
// own: only noeviction, or no limit, is safe; an evicting policy without a
// limit gets a note.
func TestPolicies(t *testing.T) {
	srv := testutil.StartServer(t)
	admin, c := srv.Client(t), srv.Client(t)
	for _, policy := range policies {
		for _, maxmemory := range []int64{0, mb100} {
			name := policy + "/" + map[int64]string{0: "no-limit", mb100: "100mb"}[maxmemory]
			t.Run(name, func(t *testing.T) {
				configSet(t, admin, "maxmemory-policy", policy)
				configSet(t, admin, "maxmemory", map[int64]string{0: "0", mb100: "100mb"}[maxmemory])
				findings, err := check(t, c, 5*time.Second)
				if len(findings) != 1 {
					t.Fatalf("findings = %+v, %v; want one", findings, err)
				}
				f := findings[0]
				if f.Addr != srv.Addr || f.Policy != policy || f.MaxMemory != maxmemory {
					t.Errorf("finding = %+v; want %s, %s, %d", f, srv.Addr, policy, maxmemory)
				}
				evicts := policy != "noeviction"
				if want := evicts && maxmemory > 0; errors.Is(err, servercheck.ErrEvictionPolicy) != want ||
					errors.Is(f.Err, servercheck.ErrEvictionPolicy) != want || (err == nil) != !want {
					t.Errorf("err = %v, finding's %v; want ErrEvictionPolicy: %v", err, f.Err, want)
				}
				if want := evicts && maxmemory == 0; (f.Note != "") != want {
					t.Errorf("note = %q; want one: %v", f.Note, want)
				}
				if f.Err != nil && (!strings.Contains(f.Err.Error(), srv.Addr) || !strings.Contains(f.Err.Error(), policy)) {
					t.Errorf("error %q names neither the server nor its policy", f.Err)
				}
			})
		}
	}
}

// renameHook renames commands on their way to the server, which then
// refuses them as unknown, as it does those that rename-command hides or a
// managed service disables (testutil starts servers without extra
// configuration).
type renameHook map[string]bool

func (h renameHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h renameHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); h[strings.ToLower(cmd.Name())] {
			args[0] = "renamed-by-test-" + cmd.Name()
		}
		return next(ctx, cmd)
	}
}

func (h renameHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// INFO memory is enough where CONFIG is refused; CONFIG GET is enough where
// INFO is; with neither the policy is unknown, and so on miniredis.
func TestRefusedCommands(t *testing.T) {
	srv := testutil.StartServer(t)
	configSet(t, srv.Client(t), "maxmemory-policy", "allkeys-lru")
	configSet(t, srv.Client(t), "maxmemory", "100mb")
	for _, tc := range []struct {
		refused string
		want    error
	}{
		{"config", servercheck.ErrEvictionPolicy},
		{"info", servercheck.ErrEvictionPolicy},
		{"info config", servercheck.ErrUnknownPolicy},
	} {
		t.Run(strings.ReplaceAll(tc.refused, " ", "+"), func(t *testing.T) {
			c := srv.Client(t)
			hook := renameHook{}
			for _, name := range strings.Fields(tc.refused) {
				hook[name] = true
			}
			c.AddHook(hook)
			findings, err := check(t, c, 5*time.Second)
			if !errors.Is(err, tc.want) || len(findings) != 1 || !errors.Is(findings[0].Err, tc.want) {
				t.Fatalf("Check = %+v, %v; want one finding of %v", findings, err, tc.want)
			}
			f := findings[0]
			if tc.want == servercheck.ErrUnknownPolicy {
				if f.Policy != "" || f.MaxMemory != -1 || !strings.Contains(err.Error(), "unknown command") {
					t.Errorf("finding = %+v; want no settings, and the server's refusals in the error", f)
				}
				return
			}
			if f.Policy != "allkeys-lru" || f.MaxMemory != mb100 {
				t.Errorf("finding = %+v; want allkeys-lru and %d", f, mb100)
			}
		})
	}
	t.Run("miniredis", func(t *testing.T) {
		b := testutil.Mini(t)
		findings, err := check(t, b.Client(t), 5*time.Second)
		if !errors.Is(err, servercheck.ErrUnknownPolicy) || errors.Is(err, servercheck.ErrNoAnswer) ||
			len(findings) != 1 || findings[0].Addr != b.Mini.Addr() {
			t.Fatalf("Check on miniredis = %+v, %v; want one finding of ErrUnknownPolicy", findings, err)
		}
	})
}

// A nil client of any kind is an error, not a panic.
func TestNilClient(t *testing.T) {
	for name, c := range testutil.NilClients() {
		u, _ := c.(redis.UniversalClient)
		if findings, err := servercheck.Check(context.Background(), u); !errors.Is(err, servercheck.ErrNilClient) || findings != nil {
			t.Errorf("%s: Check = %v, %v; want ErrNilClient", name, findings, err)
		}
	}
}

// A server that is not there: one finding of ErrNoAnswer, naming it.
func TestNoServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	findings, err := check(t, c, 5*time.Second)
	if !errors.Is(err, servercheck.ErrNoAnswer) || len(findings) != 1 || findings[0].Addr != addr || findings[0].Policy != "" {
		t.Fatalf("Check = %+v, %v; want one finding of ErrNoAnswer for %s", findings, err, addr)
	}
}

// hungBound is how late past its deadline a Check on a hung server may
// return: the machine is shared, and a test's goroutine can wait that long
// for a CPU.
const hungBound = 300 * time.Millisecond

// A server that hangs (SIGSTOP) holds Check no longer than its deadline, on
// a client that bounds commands by it and on one that does not.
func TestHungServer(t *testing.T) {
	srv := testutil.StartServer(t)
	clients := map[string]*redis.Client{
		"ContextTimeoutEnabled": redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true}),
		"default client":        redis.NewClient(&redis.Options{Addr: srv.Addr}),
	}
	for _, c := range clients {
		t.Cleanup(func() { c.Close() })
		if _, err := check(t, c, 5*time.Second); err != nil { // connections open before the stop
			t.Fatal(err)
		}
	}
	testutil.Freeze(t, srv.Pid())
	const deadline = 300 * time.Millisecond
	for name, c := range clients {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			findings, err := check(t, c, deadline)
			took := time.Since(start)
			t.Logf("Check on a SIGSTOPped %s with a %v deadline returned after %v: %v", testutil.ServerName(), deadline, took, err)
			if took > deadline+hungBound {
				t.Errorf("Check took %v; want its deadline, %v", took, deadline)
			}
			if !errors.Is(err, servercheck.ErrNoAnswer) || !errors.Is(err, context.DeadlineExceeded) ||
				len(findings) != 1 || findings[0].Addr != srv.Addr {
				t.Fatalf("Check = %+v, %v; want one finding of ErrNoAnswer and DeadlineExceeded for %s", findings, err, srv.Addr)
			}
		})
	}
}
