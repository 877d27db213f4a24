package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	_ "time/tzdata" // -budget-tz on a host without a zone database

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "sms:", err)
		os.Exit(1)
	}
}

// run parses args, serves until SIGINT or SIGTERM (or ctx ends), and shuts
// down cleanly: in-flight requests finish.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := DefaultConfig()
	fl := flag.NewFlagSet("sms", flag.ContinueOnError)
	fl.SetOutput(stderr)
	addr := fl.String("addr", "127.0.0.1:8080", "listen address")
	redisURL := fl.String("redis", "", "Redis URL (default $REDIS_URL; empty: an embedded miniredis). "+
		"redis://host:port/db; with ?master_name=NAME a Sentinel group (addr= more sentinels); with addr= more nodes a Cluster")
	secret := fl.String("secret", "", "HMAC secret, 16+ bytes (default $SMS_SECRET; empty: random per run)")
	fl.StringVar(&cfg.Region, "region", cfg.Region, "default region of numbers without +<country> (ISO 3166-1 code)")
	countries := fl.String("countries", "", "comma-separated regions whose mobile numbers get codes, or * for all "+
		"(default: the -region only; in a local demo, the console provider on loopback: US,GB,DE,FR,IN,CN and the -region)")
	fl.IntVar(&cfg.PrefixDigits, "prefix-digits", cfg.PrefixDigits, "digits after the country code that make a destination prefix (the pumping limit's key)")
	fl.Int64Var(&cfg.PrefixHourly, "prefix-hourly", cfg.PrefixHourly, "codes per destination prefix per hour")
	fl.Int64Var(&cfg.PrefixDaily, "prefix-daily", cfg.PrefixDaily, "codes per destination prefix per 24 h")
	fl.Int64Var(&cfg.DailyBudget, "daily-budget", cfg.DailyBudget, "codes the whole service sends per calendar day of -budget-tz (the cost cap)")
	budgetTZ := fl.String("budget-tz", "UTC", "IANA time zone of the budget's day (such as Asia/Shanghai): -daily-budget comes back at its midnight")
	fl.Int64Var(&cfg.IPVerifyHourly, "ip-verify-hourly", cfg.IPVerifyHourly, "verifications per client IP per hour")
	fl.DurationVar(&cfg.Cooldown, "cooldown", cfg.Cooldown, "time between two codes to one number")
	fl.Int64Var(&cfg.PhoneHourly, "phone-hourly", cfg.PhoneHourly, "codes per number in any hour")
	fl.Int64Var(&cfg.PhoneDaily, "phone-daily", cfg.PhoneDaily, "codes per number in any 24 h")
	fl.Int64Var(&cfg.IPHourly, "ip-hourly", cfg.IPHourly, "codes per client IP (IPv6: /64) per hour")
	fl.Int64Var(&cfg.IPDaily, "ip-daily", cfg.IPDaily, "codes per client IP per 24 h")
	fl.DurationVar(&cfg.CodeTTL, "code-ttl", cfg.CodeTTL, "how long a code is valid")
	fl.Int64Var(&cfg.MaxAttempts, "max-attempts", cfg.MaxAttempts, "wrong guesses that invalidate a code")
	fl.Int64Var(&cfg.MaxDailyFailures, "max-daily-failures", cfg.MaxDailyFailures, "failed verifications per number per 24 h")
	fl.DurationVar(&cfg.Timeout, "redis-timeout", cfg.Timeout, "timeout of each Redis call")
	fl.BoolVar(&cfg.TrustProxy, "trust-proxy", false, "take the client IP from X-Forwarded-For")
	fl.DurationVar(&cfg.ProviderTimeout, "provider-timeout", cfg.ProviderTimeout, "time the SMS provider has to take a message (then 502, refunded)")
	fl.Int64Var(&cfg.ProviderInFlight, "provider-inflight", cfg.ProviderInFlight, "calls to the SMS provider in flight at once across the fleet (0: no bound). "+
		"A provider refuses calls past its account's concurrency (Twilio: 429, error 20429), a limit every program on the account shares: "+
		"10 leaves the rest of it to them and still sends about 20 codes a second at 0.5 s a call, far above any -daily-budget")
	fl.DurationVar(&cfg.ProviderInFlightWait, "provider-inflight-wait", cfg.ProviderInFlightWait, "how long a send waits for a provider call to end when -provider-inflight are running (then 503 with Retry-After, refunded)")
	limits := defaultServerLimits()
	limits.flags(fl)
	conversionFlags(fl, &cfg.Conversion)
	spendFlags(fl, &cfg.Spend)
	poolFlags(fl, &cfg.Pools)
	admin := adminFlags(fl)
	metricsAddr := fl.String("metrics-addr", "", "serve /metrics on this address only (default: on -addr)")
	providerName := fl.String("provider", "", "who delivers the codes: console (stderr, and the page's outbox on loopback) "+
		"or twilio (Messages API: see the -twilio flags) (default $SMS_PROVIDER, else console)")
	twilioConfig := twilioFlags(fl, os.Getenv)
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // -h printed the usage: not a failure
		}
		return err
	}
	fromEnv(fl, os.Getenv, map[string]string{"redis": "REDIS_URL", "secret": "SMS_SECRET", "provider": "SMS_PROVIDER"})
	if *providerName == "" {
		*providerName = "console"
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if err := limits.check(cfg.ProviderTimeout, cfg.inFlightWait()); err != nil {
		return err
	}
	if err := admin.check(); err != nil {
		return err
	}
	if err := checkAddrs(listenFlag{"-addr", *addr}, listenFlag{"-metrics-addr", *metricsAddr}, listenFlag{"-admin-addr", admin.addr}); err != nil {
		return err
	}

	if err := cfg.fromFlags(*countries, *budgetTZ); err != nil {
		return err
	}
	cfg.Secret = []byte(*secret)
	if *secret == "" {
		cfg.Secret = []byte(rand.Text()) // codes and counters do not survive a restart
	}
	client, stopRedis, err := connect(*redisURL, log)
	if err != nil {
		return err
	}
	defer stopRedis()
	if *redisURL != "" { // miniredis never evicts, and does not say so
		cctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		logServerCheck(cctx, client, log)
		cancel()
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	var provider Provider
	switch *providerName {
	case "console":
		provider = &ConsoleProvider{out: stderr}
		// The demo outbox shows every code on the page: only on loopback,
		// and not behind a proxy (-trust-proxy), which would serve it to
		// whoever the proxy serves.
		cfg.DemoOutbox = loopback(ln.Addr()) && !cfg.TrustProxy
		if cfg.DemoOutbox && *countries == "" {
			cfg.Countries = demoCountries(cfg.Region) // a picker of one country shows little
		}
	case "twilio":
		tc := twilioConfig()
		tc.Timeout = cfg.ProviderTimeout
		if provider, err = NewTwilio(tc); err != nil {
			return err
		}
	default:
		return fmt.Errorf("-provider %q: want console or twilio", *providerName)
	}
	svc, err := NewService(client, cfg, provider, log)
	if err != nil {
		return err
	}
	servers := []*http.Server{limits.server(svc.Handler())}
	listeners := []net.Listener{ln}
	if *metricsAddr != "" {
		mln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			return err
		}
		defer mln.Close()
		servers[0].Handler = svc.APIHandler()
		servers = append(servers, limits.server(svc.MetricsHandler()))
		listeners = append(listeners, mln)
		fmt.Fprintf(stdout, "sms: metrics on http://%s/metrics\n", mln.Addr())
	}
	aln, err := admin.listen()
	if err != nil {
		return err
	}
	if aln != nil {
		defer aln.Close()
		servers = append(servers, limits.server(svc.AdminHandler(admin.token)))
		listeners = append(listeners, aln)
		fmt.Fprintf(stdout, "sms: operators' tools on http://%s/\n", aln.Addr())
	}
	fmt.Fprintf(stdout, "sms: serving on http://%s/\n", ln.Addr())
	if cfg.DemoOutbox {
		log.Info("demo outbox on the page: every code sent is shown there (loopback only)")
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, len(servers))
	for i, srv := range servers {
		go func() { errc <- srv.Serve(limits.listener(listeners[i])) }()
	}
	select {
	case err := <-errc:
		for _, srv := range servers {
			srv.Close()
		}
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	for _, srv := range servers {
		errs = append(errs, srv.Shutdown(sctx))
	}
	for range servers {
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// fromEnv gives each flag of vars (flag name: environment variable) that
// the command line did not set the variable's value, when it has one. The
// flag's usage names the variable; its default is not the variable's
// value, which -h would print (a secret, a Redis URL's password) beside
// the usage's own "(default $VAR)".
func fromEnv(fl *flag.FlagSet, getenv func(string) string, vars map[string]string) {
	set := map[string]bool{}
	fl.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for name, env := range vars {
		if v := getenv(env); v != "" && !set[name] {
			if err := fl.Set(name, v); err != nil {
				panic(err) // a flag not defined: a bug of this file
			}
		}
	}
}

// loopback reports whether addr is a loopback address: a service only its
// own machine can reach.
func loopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// connect returns a client of the Redis at rawURL, or of an embedded
// miniredis when rawURL is empty, and a function that closes both. Every
// client bounds its commands by their context's deadline
// (ContextTimeoutEnabled), which no URL option of go-redis sets.
func connect(rawURL string, log *slog.Logger) (redis.UniversalClient, func(), error) {
	if rawURL == "" {
		m, err := miniredis.Run()
		if err != nil {
			return nil, nil, err
		}
		log.Info("using an embedded Redis (miniredis); pass -redis for a real one")
		c := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
		return c, func() { c.Close(); m.Close() }, nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error repeats the URL, and with it any password: keep the cause only.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, nil, fmt.Errorf("redis URL (not repeated: it may hold a password): %w", err)
	}
	var c redis.UniversalClient
	q := u.Query()
	switch {
	case q.Has("master_name"):
		o, err := redis.ParseFailoverURL(rawURL)
		if err != nil {
			return nil, nil, fmt.Errorf("redis Sentinel URL: %w", err)
		}
		o.ContextTimeoutEnabled = true // a hung server costs a request its deadline, not ReadTimeout
		refuseAtOnce(&o.DialerRetries, &o.MinRetryBackoff)
		c = redis.NewFailoverClient(o)
	case q.Has("addr"):
		o, err := redis.ParseClusterURL(rawURL)
		if err != nil {
			return nil, nil, fmt.Errorf("redis Cluster URL: %w", err)
		}
		o.ContextTimeoutEnabled = true
		refuseAtOnce(&o.DialerRetries, &o.MinRetryBackoff)
		c = redis.NewClusterClient(o)
	default:
		o, err := redis.ParseURL(rawURL)
		if err != nil {
			return nil, nil, fmt.Errorf("redis URL: %w", err)
		}
		o.ContextTimeoutEnabled = true
		refuseAtOnce(&o.DialerRetries, &o.MinRetryBackoff)
		c = redis.NewClient(o)
	}
	return c, func() { c.Close() }, nil
}

// refuseAtOnce makes a refused connection cost a request one dial: go-redis
// by default dials 5 times, 100 ms apart, for each of its 4 tries of a
// command (1.7 s, past every guard's Timeout), until PoolSize dials have
// failed. One dial per try and no pause between tries (DialerRetries 1,
// MinRetryBackoff -1) answer a refused connection at once, with a 503,
// unless the URL set them; MaxRetries stays, so a lost reply is still
// sent again.
func refuseAtOnce(dialerRetries *int, minRetryBackoff *time.Duration) {
	if *dialerRetries == 0 {
		*dialerRetries = 1
	}
	if *minRetryBackoff == 0 {
		*minRetryBackoff = -1
	}
}

// listenFlag is a flag that names an address to listen on, and its value.
type listenFlag struct{ name, addr string }

// checkAddrs refuses two listen flags that name one address: the second
// listener would fail with "bind: address already in use", naming neither
// flag. Two addresses are one when their ports are one (port 0, the
// kernel's pick, never is) and so are their hosts: the same name or IP, or
// a wildcard ("", 0.0.0.0 for IPv4, :: for both) beside any host of its
// family, or localhost beside a loopback IP. A flag that is not set ("")
// is not compared; an address that does not parse is left for the listener
// to refuse.
func checkAddrs(flags ...listenFlag) error {
	for i, a := range flags {
		for _, b := range flags[i+1:] {
			if a.addr != "" && b.addr != "" && sameAddr(a.addr, b.addr) {
				return fmt.Errorf("%w: %s %q and %s %q are one address: give each its own port", errConfig, a.name, a.addr, b.name, b.addr)
			}
		}
	}
	return nil
}

func sameAddr(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil {
		return false
	}
	na, errA := net.LookupPort("tcp", pa)
	nb, errB := net.LookupPort("tcp", pb)
	if errA != nil || errB != nil || na != nb || na == 0 {
		return false
	}
	return sameHost(ha, hb) || sameHost(hb, ha)
}

// sameHost reports whether listening on host a takes the port of host b.
func sameHost(a, b string) bool {
	ipb := net.ParseIP(b)
	switch {
	case strings.EqualFold(a, b), a == "", a == "::":
		return true
	case a == "0.0.0.0":
		return b == "localhost" || ipb != nil && ipb.To4() != nil
	case strings.EqualFold(a, "localhost"):
		return ipb != nil && ipb.IsLoopback()
	}
	ipa := net.ParseIP(a)
	return ipa != nil && ipa.Equal(ipb)
}
