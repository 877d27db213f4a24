// Package nilcheck reports whether an interface holds nil, including a typed
// nil pointer, so that constructors can refuse a nil client with an error
// instead of panicking on first use.
package nilcheck
