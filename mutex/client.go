package mutex

import "github.com/redis/go-redis/v9"

// Client is the part of a go-redis client that a Locker needs: running
// scripts. *redis.Client (including the one NewFailoverClient returns),
// *redis.ClusterClient, *redis.Ring and any redis.UniversalClient satisfy it,
// and so does a small wrapper that counts calls or injects faults.
type Client interface {
	redis.Scripter
}

var (
	_ Client = (*redis.Client)(nil)
	_ Client = (*redis.ClusterClient)(nil)
	_ Client = (*redis.Ring)(nil)
	_ Client = redis.UniversalClient(nil)
)
