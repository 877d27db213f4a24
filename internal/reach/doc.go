// Package reach tells an error that says Redis cannot be reached now (the
// connection was refused, there is no route to the host, the client was
// closed) from one of unknown outcome (a time-out, a connection lost with a
// command on it) and from Redis's own answers.
//
// An unreachable Redis ran nothing, and the next call made at once would
// hear the same: the libraries end a call on the first such error instead
// of waiting for its deadline or letting other calls make the same attempt
// in turn. A hung server is not unreachable: it may still answer, so it
// costs a call its deadline. This is the one place where that line is drawn.
package reach
