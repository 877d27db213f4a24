package guard

// A byteSet is a class of bytes, such as the characters of an HTTP token:
// one lookup where a chain of comparisons would take a dozen, and the class
// reads as the grammar spells it. The sets are built when the package is
// initialized and only read after.
type byteSet [256]bool

// newByteSet is the set of the bytes of chars.
func newByteSet(chars string) byteSet {
	var set byteSet
	for i := range len(chars) {
		set[chars[i]] = true
	}
	return set
}

// all reports whether every byte of s is in the set (true for "").
func (set *byteSet) all(s string) bool {
	for i := range len(s) {
		if !set[s[i]] {
			return false
		}
	}
	return true
}

const (
	digits = "0123456789"
	alnum  = digits + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)
