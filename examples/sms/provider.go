package main

import (
	"context"
	"fmt"
	"io"
	"sync"
)

// A Provider delivers text messages (an SMS gateway).
type Provider interface {
	Send(ctx context.Context, to, text string) error
}

// ConsoleProvider "sends" by printing one line per message,
// `sms to=<E.164> text=<message>`, for local use: the only place a code
// appears.
type ConsoleProvider struct {
	mu  sync.Mutex
	out io.Writer
}

// Send prints the message.
func (p *ConsoleProvider) Send(_ context.Context, to, text string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := fmt.Fprintf(p.out, "sms to=%s text=%s\n", to, text)
	return err
}
