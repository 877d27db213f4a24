package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"

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
