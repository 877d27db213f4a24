// Command sms is a verification-code service protected by funnelguard.
//
//	go run ./examples/sms                 # embedded Redis (miniredis), 127.0.0.1:8080
//	go run ./examples/sms -redis redis://127.0.0.1:6379/0
//
// See README.md for the HTTP API and a curl session.
package main
