package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	dirPrefix = "kubetest-"
	ownerFile = "owner.pid"
)

// proc is one control-plane process.
type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, set before done closes
}

// startProc starts bin with its output in logPath. The process gets
// SIGKILL if the test binary dies without stopping it (a panic, a go test
// timeout): Linux sends the parent-death signal when the thread that
// started the child ends, so that thread stays locked to the goroutine
// that waits for the child.
func startProc(name, bin, logPath string, args ...string) (*proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, log: logPath, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the child
		defer func() { _ = logf.Close() }()
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("cannot start %s: %w", name, err)
			return
		}
		p.cmd = cmd
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// stop sends SIGTERM to the process's own PID, then SIGKILL after 15 s.
func (p *proc) stop() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(15 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s (pid %d) ignored SIGTERM for 15 s and was killed", p.name, p.cmd.Process.Pid)
}

// exited reports whether the process has ended, and why.
func (p *proc) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// waitFor polls ready until it succeeds, the process exits or timeout
// passes; a failure carries the end of the process's log.
func waitFor(p *proc, timeout time.Duration, ready func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if gone, err := p.exited(); gone {
			tail := p.logTail()
			if strings.Contains(tail, "address already in use") {
				return fmt.Errorf("%s exited (%v): %w\n%s", p.name, err, errPortTaken, tail)
			}
			return fmt.Errorf("%s exited at start (%v); its log ends:\n%s", p.name, err, tail)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		last = ready(ctx)
		cancel()
		if last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s (%v); its log ends:\n%s", p.name, timeout, last, p.logTail())
}

// logTail is the last 30 lines of the process's log.
func (p *proc) logTail() string {
	data, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// removeStale deletes the directories of control planes whose test binary
// died before it could (their processes died with it).
func removeStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not ours, or still being created
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(dir)
		}
	}
}
