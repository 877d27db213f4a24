package mutex

// votes are the nodes' answers to one acquire attempt: the leases of the
// nodes that granted it, the errors, and the shortest wait a refusing node
// reported (-1: none).
type votes struct {
	leases []int64
	errs   []error
	wait   int64
}

// count adds one node's reply.
func (v *votes) count(nr nodeReply) {
	var r [3]int64
	var res any
	err := nr.err
	if err == nil {
		r, res, err = acquired(nr.reply)
	}
	switch {
	case err != nil:
		v.errs = append(v.errs, err)
	case r[0] == 1:
		v.leases = append(v.leases, r[1])
	case r[0] == 0 && r[1] >= 0:
		v.refused(r[1]) // held by another: free again after its lease at most
	case r[0] == declinedReply:
		// Rejoining: a refusal, for the wait the gate reported.
		if w, ok := rejoinWait(res); ok {
			v.refused(w)
		}
	}
	// A re-entry that found no lock on the node ({0, -2}) counts for nothing.
}

// refused records a node's refusal for wait ms.
func (v *votes) refused(wait int64) {
	if v.wait < 0 || wait < v.wait {
		v.wait = wait
	}
}

// rejoinWait reads the rejoin gate's result: the ms until the node grants.
func rejoinWait(res any) (int64, bool) {
	arr, _ := res.([]any)
	if len(arr) == 0 {
		return 0, false
	}
	w, ok := arr[0].(int64)
	return w, ok
}
