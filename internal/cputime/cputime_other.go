//go:build !unix

package cputime

func now() (int64, bool) { return 0, false }
