// Package forgetful is a map of at most a bound of keys that forgets the
// older half of them when a new key would pass the bound: the memory of
// funnel.Local, funnel's state cache and guard's Fallback, which must stay
// bounded whatever keys arrive, and for which a forgotten key starts over.
package forgetful
