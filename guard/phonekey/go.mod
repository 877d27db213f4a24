module github.com/funnelguard/funnelguard/guard/phonekey

go 1.26.0

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/funnelguard/funnelguard v0.0.0
	github.com/nyaruka/phonenumbers v1.8.1
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	golang.org/x/time v0.16.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/funnelguard/funnelguard => ../..
