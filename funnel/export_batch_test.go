package funnel

// StateField returns the field of r in a key's state hash.
func StateField(r Rule) string {
	c, err := r.compile()
	if err != nil {
		panic(err)
	}
	return c.id
}
