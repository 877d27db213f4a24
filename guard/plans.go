package guard

import (
	"context"
	"fmt"
	"strconv"

	"github.com/funnelguard/funnelguard/funnel"
)

// planOf returns the name and rules of key's plan (key as the caller gave
// it): WithRules', or those of the plan WithPlans' planOf names. An error
// of planOf, or a name the plans do not hold, matches ErrPlan.
func (g *Guard) planOf(ctx context.Context, key string) (string, []funnel.Rule, error) {
	if g.cfg.PlanOf == nil {
		return "", g.cfg.Rules, nil
	}
	name, err := g.cfg.PlanOf(ctx, key)
	rules, ok := g.cfg.Plans[name]
	switch {
	case err != nil:
		return name, nil, fmt.Errorf("%w: %w", ErrPlan, err)
	case !ok:
		return name, nil, fmt.Errorf("%w: %q is not one of the plans (WithPlans)", ErrPlan, name)
	}
	return name, rules, nil
}

func checkPlan(name string, rules []funnel.Rule) error {
	if name == "" || len(rules) == 0 {
		return fmt.Errorf("%w: plan %q: a plan has a name and at least one rule (the plan \"\" is WithRules')", ErrInvalidOption, name)
	}
	if err := funnel.Validate(rules...); err != nil {
		return fmt.Errorf("%w: plan %q: %w", ErrInvalidOption, name, err)
	}
	return nil
}

// sharing returns a copy of rules, each sharing the state "plan rule j", j
// the least that no earlier rule of the same kind, period and zone took
// (Validate refuses two rules of one call in one state): the first rule of
// a kind and period in every plan shares one state, the second another,
// in whatever order the plans list them. A rule invalid otherwise keeps
// "plan rule i", and New reports it.
func sharing(rules []funnel.Rule) []funnel.Rule {
	out := make([]funnel.Rule, len(rules))
	for i, r := range rules {
		for j := range i + 1 {
			if out[i] = r.Sharing("plan rule " + strconv.Itoa(j)); funnel.Validate(append(out[:i:i], out[i])...) == nil {
				break
			}
		}
	}
	return out
}
