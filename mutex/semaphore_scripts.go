package mutex

import (
	_ "embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed semaphore.lua
	semaphorePrologue string
	//go:embed semaphore_lib.lua
	semaphoreLib string
	//go:embed semaphore_acquire.lua
	semAcquireBody string
	//go:embed semaphore_release.lua
	semReleaseBody string
	//go:embed semaphore_extend.lua
	semExtendBody string
)

// The semaphore's scripts: each is semaphore.lua's prologue, then its
// body's fast path, semaphore_lib.lua's functions and its body's general
// path (what follows the line "-- general path"). A Lua closure is made
// when its definition runs, so a call that returns on the fast path makes
// none (issue 45: the closures and their upvalues were a third of a
// script's time).
var (
	semAcquireScript = semScript(semAcquireBody)
	semReleaseScript = semScript(semReleaseBody)
	semExtendScript  = semScript(semExtendBody)
)

// semGeneral marks where a script body's general path starts.
const semGeneral = "-- general path\n"

func semScript(body string) *redis.Script {
	fast, general, ok := strings.Cut(body, semGeneral)
	if !ok {
		panic("mutex: a semaphore script has no general path")
	}
	return redis.NewScript(semaphorePrologue + fast + semaphoreLib + general)
}

// Replies of semaphore_acquire.lua (the first element) and of
// semaphore_release.lua.
const (
	semGranted   = 1
	semBadSize   = -1
	semEnded     = -2
	semReleased  = 1
	semNotHolder = 0
)
