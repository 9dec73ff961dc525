package main

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestRunRefusesBadUsage(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for name, tc := range map[string]struct {
		args  []string
		env   map[string]string
		usage bool
		want  string
	}{
		"unknown flag":     {args: []string{"-bogus"}, usage: true, want: "bogus"},
		"argument":         {args: []string{"extra"}, usage: true, want: `unexpected argument "extra"`},
		"bad duration":     {args: []string{"-duration", "soon"}, usage: true, want: "soon"},
		"bad server-env":   {args: []string{"-server-env", "REGISTRY_NODE_CACHE"}, usage: true, want: "want NAME=VALUE"},
		"unknown workload": {args: []string{"-registryd", "/bin/true", "-workloads", "heartbeat,bogus"}, want: `no workload "bogus"`},
		"url alone":        {args: []string{"-url", "http://127.0.0.1:1"}, want: "REGISTRY_DATABASE_URL"},
		"url, no secret": {args: []string{"-url", "http://127.0.0.1:1"}, env: map[string]string{"REGISTRY_DATABASE_URL": "postgres:///x"},
			want: "REGISTRY_JWT_SECRET) or an admin token (REGISTRY_TOKEN"},
		"url, startup": {args: []string{"-url", "http://127.0.0.1:1", "-workloads", "retrieve,startup"},
			env: map[string]string{"REGISTRY_DATABASE_URL": "postgres:///x", "REGISTRY_JWT_SECRET": "s"}, want: "startup workload restarts the server"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tc.args, env(tc.env), &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run = %v, want an error with %q", err, tc.want)
			}
			if got := errors.As(err, new(usageError)); got != tc.usage {
				t.Errorf("usage error %v, want %v", got, tc.usage)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout: %s", stdout.String())
			}
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	err := run(t.Context(), []string{"-h"}, func(string) string { return "" }, &bytes.Buffer{}, &stderr)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("run -h = %v", err)
	}
	for _, want := range []string{"-nodes", "-duration", "-clients", "-workloads", "-json", "REGISTRY_JWT_SECRET"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("help lacks %s", want)
		}
	}
}
