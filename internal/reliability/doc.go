// Package reliability holds the toolkit's fault, pause, over-admission and
// linearizability tests: they run mutex, funnel and guard together against
// real redis-server processes on loopback that the tests kill, restart,
// pause, or reach through an in-process toxiproxy. The package has no code
// of its own; RELIABILITY.md at the repository root lists its figures.
package reliability
