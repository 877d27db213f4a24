package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
)

// A Provider delivers text messages (an SMS gateway).
//
// Send returns nil once the provider accepted the message, an error matching
// ErrDestinationRefused when the provider refused this destination for good
// (not a valid or reachable mobile number, a country the account may not send
// to, a recipient who opted out): the service refunds the send and answers
// 422. Any other error (the provider failed, timed out, or refused our
// credentials) is refunded and answered 502.
type Provider interface {
	Send(ctx context.Context, to, text string) error
}

// ErrDestinationRefused reports a provider's refusal of a destination, which
// sending again will not change.
var ErrDestinationRefused = errors.New("provider refused the destination")

// ConsoleProvider "sends" by printing one line per message,
// `sms to=<E.164> text=<message>`, for local use, and keeps the last few in
// an outbox that the page shows when the service listens on loopback only.
type ConsoleProvider struct {
	mu     sync.Mutex
	out    io.Writer
	outbox []outboxMessage
}

// outboxMessage is one message the console provider printed.
type outboxMessage struct {
	To   string `json:"to"`
	Text string `json:"text"`
}

// outboxSize is how many messages the console provider's outbox keeps.
const outboxSize = 20

// Send prints the message.
func (p *ConsoleProvider) Send(_ context.Context, to, text string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.outbox) == outboxSize {
		p.outbox = append(p.outbox[:0], p.outbox[1:]...)
	}
	p.outbox = append(p.outbox, outboxMessage{To: to, Text: text})
	_, err := fmt.Fprintf(p.out, "sms to=%s text=%s\n", to, text)
	return err
}

// Outbox returns the last messages sent, newest first.
func (p *ConsoleProvider) Outbox() []outboxMessage {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]outboxMessage, len(p.outbox))
	for i, m := range p.outbox {
		out[len(out)-1-i] = m
	}
	return out
}
