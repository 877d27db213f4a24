package main

import (
	"context"
	"io"
	"regexp"
	"strings"
	"testing"
)

// -h prints each flag's default once, and names each environment variable
// once: a flag that defaults to a variable says so in its usage, and the
// flag package adds no "(default ...)" of the variable's value beside it
// (which would print a secret, or a Redis URL's password, to whoever reads
// -h). With every such variable set, as on a deployed host.
func TestHelpDefaultsOnce(t *testing.T) {
	env := map[string]string{
		"REDIS_URL": "redis://:hunter2-password@redis.example:6379/0", "SMS_SECRET": "secret-of-the-env-32-bytes-12345",
		"SMS_PROVIDER": "twilio", "SMS_ADMIN_TOKEN": "admin-token-of-the-env-123456789", "SMS_PUBLIC_URL": "https://sms.example",
		"TWILIO_API_URL": "http://127.0.0.1:1", "TWILIO_ACCOUNT_SID": "AC0123456789abcdef0123456789abcdef",
		"TWILIO_API_KEY_SID": "SK0123456789abcdef0123456789abcdef", "TWILIO_FROM": "+15005550006",
		"TWILIO_MESSAGING_SERVICE_SID": "MG0123456789abcdef0123456789abcdef", "TWILIO_AUTH_TOKEN": "token-of-the-env-0123456789abcdef",
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	var out strings.Builder
	if err := run(context.Background(), []string{"-h"}, io.Discard, &out); err != nil {
		t.Fatalf("-h: %v", err)
	}
	usage := out.String()
	if strings.Count(usage, "\n  -") < 50 {
		t.Fatalf("-h printed %q; want the flags", usage)
	}
	envVar := regexp.MustCompile(`\$[A-Z][A-Z0-9_]*`)
	for _, line := range strings.Split(usage, "\n") {
		if n := strings.Count(line, "(default"); n > 1 {
			t.Errorf("%d defaults in %q", n, line)
		}
		seen := map[string]bool{}
		for _, v := range envVar.FindAllString(line, -1) {
			if seen[v] {
				t.Errorf("%s named twice in %q", v, line)
			}
			seen[v] = true
		}
	}
	for k, v := range env {
		if k != "SMS_PROVIDER" && strings.Contains(usage, v) { // "twilio" is a word of the usage
			t.Errorf("-h prints the value of $%s", k)
		}
	}
}
