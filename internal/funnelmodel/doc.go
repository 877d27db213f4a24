// Package funnelmodel is the exact model of funnel's rules, in rationals and
// in the microseconds of a schedule, and the random schedules the tests
// play against it: funnel's tests and the reliability suite's comparison
// with redis_rate share it. Tests only: nothing in the library imports it.
package funnelmodel
