// Package launch starts and stops what the bench's harnesses run on
// 127.0.0.1: enginesim processes (Sim), the EPP in this process or as a
// child process (several side by side, each in its own directory), the
// no-op floor server or another project's EndpointPicker run from a shell
// command in its place (EPP), and the test gateway in front of it
// (Gateway). Every child process is stopped, gracefully or with SIGKILL,
// by its own PID (a shell command: the process group it leads), never by
// name.
//
// It is the bench's one way into the EPP's assembly (epp): one
// Spec configures the EPP wherever it runs, and a child's config file is
// the config the EPP in process would run. It is the one place where the
// bench writes scheduler.Config fields (Tuning).
package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// running is something started that may end on its own: a child process
// or an EPP's Run in this process.
type running struct {
	exited chan struct{} // closed once it ended
	err    error         // why it ended, set before exited closes
}

func newRunning() *running { return &running{exited: make(chan struct{})} }

func (r *running) end(err error) {
	r.err = err
	close(r.exited)
}

// child is a process the bench started.
type child struct {
	*running
	cmd *exec.Cmd
	// group: the process leads its own process group, and every signal
	// goes to the group (a shell command's children with it).
	group bool
}

func startChild(bin string, args []string, stdout, stderr io.Writer) (*child, error) {
	return start(exec.Command(bin, args...), stdout, stderr, false)
}

// startGroup starts bin as the leader of a new process group, whose ID is
// the child's own PID: a command that forks (a shell running a pipeline, a
// wrapper script) is stopped whole, and nothing else is signalled.
func startGroup(bin string, args []string, stdout, stderr io.Writer) (*child, error) {
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return start(cmd, stdout, stderr, true)
}

func start(cmd *exec.Cmd, stdout, stderr io.Writer, group bool) (*child, error) {
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{running: newRunning(), cmd: cmd, group: group}
	go func() { c.end(cmd.Wait()) }()
	return c, nil
}

// signal sends sig to the process, or to its group.
func (c *child) signal(sig syscall.Signal) error {
	if c.group {
		// A negative PID addresses the group the child leads; ESRCH means
		// no member is left.
		if err := syscall.Kill(-c.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
		return nil
	}
	if err := c.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// groupGone waits until no member of the child's group is left, or until
// deadline; it reports whether none is. A process without a group is gone
// once it has exited.
func (c *child) groupGone(deadline time.Time) bool {
	if !c.group {
		return true
	}
	for {
		// Signal 0 checks for members without signalling them; ESRCH: none
		// (a member that died is reaped by init at once, so a zombie does
		// not hold the wait for long).
		if err := syscall.Kill(-c.cmd.Process.Pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits up to grace for the process (and every
// member of its group) to end, then sends SIGKILL; killed reports the
// latter.
func (c *child) stop(grace time.Duration) (killed bool) {
	deadline := time.Now().Add(grace)
	select {
	case <-c.exited:
		if c.groupGone(time.Now()) {
			return false
		}
	default:
	}
	_ = c.signal(syscall.SIGTERM)
	select {
	case <-c.exited:
		if c.groupGone(deadline) {
			return false
		}
	case <-time.After(grace):
	}
	_ = c.signal(syscall.SIGKILL)
	<-c.exited
	c.groupGone(time.Now().Add(5 * time.Second))
	return true
}

// kill ends the process (and its group) with SIGKILL, as a crash: no
// clean shutdown.
func (c *child) kill() error {
	if err := c.signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-c.exited
	if !c.groupGone(time.Now().Add(5 * time.Second)) {
		return fmt.Errorf("process group %d still has members 5s after SIGKILL", c.cmd.Process.Pid)
	}
	return nil
}

// waitErr is why the process ended, unless that was an exit status (a
// non-zero exit or a signal): an error of waiting itself.
func (c *child) waitErr() error {
	var ee *exec.ExitError
	if c.err != nil && !errors.As(c.err, &ee) {
		return c.err
	}
	return nil
}

// poll calls done every 20 ms until it reports true. It fails when r ends
// (r may be nil), ctx ends or limit passes; the last error says the state
// done reported last.
func poll(ctx context.Context, limit time.Duration, r *running, done func() (bool, string)) error {
	var exited chan struct{}
	if r != nil {
		exited = r.exited
	}
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, state := done()
		if ok {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("exited during start-up: %v", r.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("%s after %v", state, limit)
		case <-tick.C:
		}
	}
}
