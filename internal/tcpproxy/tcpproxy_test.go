package tcpproxy

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// echo starts a server that answers each line with its name and the line.
func echo(t *testing.T, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					io.WriteString(c, name+" "+line)
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// ask sends line on c and returns the answer.
func ask(t *testing.T, c net.Conn, line string) (string, error) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	answer, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(answer), err
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestCutAndRetarget(t *testing.T) {
	p := Start(t, echo(t, "a"), nil)
	c := dial(t, p.Addr())
	if got, err := ask(t, c, "hello"); got != "a hello" || err != nil {
		t.Fatalf("through the proxy: %q, %v; want a hello", got, err)
	}
	if n := p.Cut(); n != 1 {
		t.Errorf("Cut() = %d, want 1", n)
	}
	if got, err := ask(t, c, "again"); err == nil {
		t.Errorf("a cut connection answered %q", got)
	}
	p.SetTarget(echo(t, "b"))
	if got, err := ask(t, dial(t, p.Addr()), "hello"); got != "b hello" || err != nil {
		t.Errorf("after SetTarget: %q, %v; want b hello", got, err)
	}
	if n := p.Accepted(); n != 2 {
		t.Errorf("Accepted() = %d, want 2", n)
	}
	p.Close()
	if c, err := net.Dial("tcp", p.Addr()); err == nil {
		c.Close()
		t.Error("a closed proxy accepted a connection")
	}
}

func TestRefuse(t *testing.T) {
	var refused atomic.Value
	refused.Store("none")
	p := Start(t, "", func(first []byte) bool { return strings.HasPrefix(string(first), refused.Load().(string)) })
	p.SetTarget(echo(t, "a")) // connections made before wait for the target
	kept := dial(t, p.Addr())
	if got, err := ask(t, kept, "kept"); got != "a kept" || err != nil {
		t.Fatalf("an accepted first line: %q, %v", got, err)
	}
	refused.Store("kept")
	if got, err := ask(t, dial(t, p.Addr()), "kept too"); err == nil {
		t.Errorf("a refused first line was answered: %q", got)
	}
	if got, err := ask(t, kept, "still"); got != "a still" || err != nil {
		t.Errorf("an open connection before CutRefused: %q, %v", got, err)
	}
	p.CutRefused()
	if _, err := ask(t, kept, "gone"); err == nil {
		t.Error("a connection CutRefused should have cut answered")
	}
}
