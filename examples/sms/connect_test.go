package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The -redis URL picks the client: a plain server, a Sentinel group
// (master_name=) or a Cluster (addr= nodes). No server is contacted.
func TestConnectURLForms(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		url     string
		cluster bool
	}{
		{"redis://127.0.0.1:6379/0", false},
		{"redis://127.0.0.1:26379?master_name=mymaster&addr=127.0.0.1:26380", false},
		{"redis://127.0.0.1:7000?addr=127.0.0.1:7001&addr=127.0.0.1:7002", true},
	} {
		c, stop, err := connect(tc.url, log)
		if err != nil {
			t.Fatalf("connect(%s): %v", tc.url, err)
		}
		_, isCluster := c.(*redis.ClusterClient)
		if isCluster != tc.cluster {
			t.Errorf("connect(%s) = %T", tc.url, c)
		}
		stop()
	}
	for _, bad := range []string{"http://x", "redis://127.0.0.1:6379?master_name=m&bogus=1", "redis://%zz",
		"redis://user:s3cret-pass@127.0.0.1:6379/%zz", "redis://user:s3cret-pass@[::1"} {
		_, _, err := connect(bad, log)
		if err == nil {
			t.Errorf("connect(%s) accepted", bad)
		} else if strings.Contains(err.Error(), "s3cret-pass") {
			t.Errorf("connect(%s) error repeats the password: %v", bad, err)
		}
	}
}

// A Redis that refuses connections costs a command one dial, not go-redis's
// default 5 dials for each of 4 tries (1.7 s): the service answers 503 at
// once. The URL's own settings win.
func TestConnectRefusesAtOnce(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	c, stop, err := connect("redis://"+addr+"/0", log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := c.Ping(ctx).Err(); err == nil || time.Since(start) > time.Second {
		t.Fatalf("PING to a closed port: %v after %v; want a refusal within 1s", err, time.Since(start))
	}
	if o := c.(*redis.Client).Options(); o.MaxRetries != 3 {
		t.Errorf("MaxRetries %d: lost replies must still be retried", o.MaxRetries)
	}
	c2, stop2, err := connect("redis://"+addr+"/0?min_retry_backoff=20ms", log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()
	if o := c2.(*redis.Client).Options(); o.MinRetryBackoff != 20*time.Millisecond || o.DialerRetries != 1 {
		t.Errorf("URL's min_retry_backoff: MinRetryBackoff %v, DialerRetries %d; want 20ms and 1", o.MinRetryBackoff, o.DialerRetries)
	}
}
