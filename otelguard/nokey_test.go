package otelguard_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/funnelguard/funnelguard/guard"
	"github.com/funnelguard/funnelguard/otelguard"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// badPhone is a key the guard's WithNormalize func rejects with an error that
// quotes it, as errors often do.
const badPhone = "+86138001380xx"

func normalize(k string) (string, error) {
	if k == badPhone {
		return "", fmt.Errorf("not a phone number: %q", k)
	}
	return k, nil
}

// Every call the package wraps, on the key, then every attribute, span
// name, status and event of every span (redisotel's too, made without the
// statement), and every attribute of every metric: the key is in none, nor
// the rejected key, which its error quotes.
func TestNoKeyInTelemetry(t *testing.T) {
	e := newEnv(t)
	tr := e.tracer(t)
	g := tr.Guard(e.guard(t, guard.WithPrefix("sms:phone:"), guard.WithNormalize(normalize)), "sms:phone:")
	ctx := context.Background()
	for range 3 {
		if _, err := g.Allow(ctx, phone); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.Do(ctx, phone, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Allow(ctx, badPhone); !errors.Is(err, guard.ErrInvalidKey) || !strings.Contains(err.Error(), badPhone) {
		t.Fatalf("Allow(badPhone): %v, want ErrInvalidKey quoting the key", err)
	}
	lk, err := tr.Lock(ctx, e.locker(t), phone)
	if err != nil {
		t.Fatal(err)
	}
	_ = lk.Unlock(ctx)
	sem, err := e.locker(t).Semaphore(phone, 1)
	if err != nil {
		t.Fatal(err)
	}
	p, err := tr.Acquire(ctx, sem, 1)
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Release(ctx)

	var seen int
	check := func(where, v string) {
		seen++
		for _, k := range []string{phone, badPhone} {
			if strings.Contains(v, k) {
				t.Errorf("%s holds the key: %q", where, v)
			}
		}
	}
	checkAttrs := func(where string, kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			check(where+" "+string(kv.Key), kv.Value.Emit())
		}
	}
	for _, s := range e.spans.Ended() {
		where := "span " + s.Name()
		check(where, s.Name())
		check(where+" status", s.Status().Description)
		checkAttrs(where, s.Attributes())
		checkAttrs(where+" resource", s.Resource().Attributes())
		for _, ev := range s.Events() {
			check(where+" event", ev.Name)
			checkAttrs(where+" event "+ev.Name, ev.Attributes)
		}
	}
	for _, sm := range e.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			for _, set := range pointAttrs(t, m) {
				checkAttrs("metric "+m.Name, set.ToSlice())
			}
		}
	}
	if seen < 100 {
		t.Errorf("checked only %d values", seen)
	}
}

// pointAttrs returns the attributes of m's points; it fails on a kind of
// metric it does not know, so that none goes unchecked.
func pointAttrs(t *testing.T, m metricdata.Metrics) []attribute.Set {
	t.Helper()
	var sets []attribute.Set
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			sets = append(sets, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			sets = append(sets, p.Attributes)
		}
	default:
		t.Fatalf("metric %s: %T unchecked", m.Name, m.Data)
	}
	return sets
}

// WithKeyAttributes puts the caller's attribute of the key on the spans
// (the lock's name, the semaphore's too), and no metric gets it;
// WithAttributes goes on both.
func TestKeyAndConstantAttributes(t *testing.T) {
	secret := []byte("k")
	hash := func(key string) []attribute.KeyValue {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(key))
		return []attribute.KeyValue{attribute.String("phone.hmac", hex.EncodeToString(m.Sum(nil)))}
	}
	want := hash(phone)[0].Value.Emit()
	e := newEnv(t)
	endpoint := otelguard.WithAttributes(attribute.String("endpoint", "send"))
	tr := e.tracer(t, otelguard.WithKeyAttributes(hash), endpoint)
	obs, err := otelguard.NewObserver(e.mp, otelguard.WithKeyAttributes(hash), endpoint)
	if err != nil {
		t.Fatal(err)
	}
	g := tr.Guard(e.guard(t, guard.WithObserve(obs.Observe)), "")
	ctx := context.Background()
	if _, err := g.Allow(ctx, phone); err != nil {
		t.Fatal(err)
	}
	lk, err := tr.Lock(ctx, e.locker(t), phone)
	if err != nil {
		t.Fatal(err)
	}
	_ = lk.Unlock(ctx)

	for _, name := range []string{otelguard.SpanAllow, otelguard.SpanLock} {
		a := spanAttrs(e.spanNamed(t, name))
		if a["phone.hmac"] != want || a["endpoint"] != "send" {
			t.Errorf("span %s: attributes %v, want phone.hmac %s and endpoint send", name, a, want)
		}
	}
	for _, sm := range e.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			for _, set := range pointAttrs(t, m) {
				a := attrs(set)
				if _, ok := a["phone.hmac"]; ok || a["endpoint"] != "send" {
					t.Errorf("metric %s: attributes %v, want endpoint and no phone.hmac", m.Name, a)
				}
			}
		}
	}
}
