// Package keyspace builds the Redis keys of funnelguard so that every key of
// one user key lands in the same Redis Cluster hash slot, whatever bytes the
// user key holds.
//
// A key is <prefix>{<tag>}:<kind>. The tag is the user key with '~', '{' and
// '}' escaped as "~0", "~1" and "~2": it holds no brace, so Redis Cluster
// hashes exactly the tag for every kind (unescaped, "}{" would give an
// empty hash tag, and a user key's lock and state could part slots), and
// distinct user keys give distinct tags. The empty name's tag is "~".
package keyspace
