// Package testmust builds the Lockers, Limiters and keys that tests need
// with options that must be good: a constructor's error fails the test
// where it happens. (testutil cannot: mutex's own tests import it.)
package testmust
