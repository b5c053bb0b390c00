package testutil

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/flatnet/flatnet/internal/netns"
)

// EchoServer listens on TCP addr inside the namespace at nsPath and answers
// each line with "<prefix> <client ip>\n". It stops when t ends. It returns
// the listening address.
func EchoServer(t testing.TB, nsPath, addr, prefix string) string {
	t.Helper()
	var ln net.Listener
	err := netns.Do(nsPath, func() error {
		var err error
		ln, err = net.Listen("tcp", addr) // the socket belongs to nsPath
		return err
	})
	if err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, nsPath, err)
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
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
				fmt.Fprintf(c, "%s %s\n", prefix, host)
			}()
		}
	}()
	return ln.Addr().String()
}

// Ask dials TCP addr from inside nsPath, sends a line and returns the
// answer line (without newline).
func Ask(nsPath, addr string) (string, error) {
	var c net.Conn
	err := netns.Do(nsPath, func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 3*time.Second)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "hello\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}
