// Command failover writes to registryd without pause while
// scripts/failover.sh kills its PostgreSQL primary and promotes the
// synchronous standby, then reports when writes stopped and resumed and
// whether every acknowledged write is still there. See scripts/failover.sh.
//
//	failover -url http://127.0.0.1:PORT -token T -duration 30s -marks FILE
//
// Each worker registers nodes one after another (POST /v1/nodes/create,
// each a new address): a 201 is an acknowledged write. No retries: every
// request counts once. When the duration is up it reads FILE, lines of
// "NAME UNIX_NANOS" the script wrote (kill, killed, promote, promoted,
// ready), prints the timeline
// and lists every node through registryd to check that no acknowledged
// write was lost. It exits 1 if one was, or if writes never resumed.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

type result struct {
	ip         string
	start, end time.Time
	status     int // 0: no answer
	err        string
}

func main() {
	url := flag.String("url", "", "registryd's base URL")
	token := flag.String("token", "", "an admin token")
	duration := flag.Duration("duration", 30*time.Second, "how long to write")
	workers := flag.Int("workers", 4, "concurrent writers")
	marks := flag.String("marks", "", "file of NAME UNIX_NANOS lines the driving script writes")
	flag.Parse()
	if *url == "" || *token == "" || *marks == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*url, *token, *duration, *workers, *marks); err != nil {
		fmt.Fprintln(os.Stderr, "failover:", err)
		os.Exit(1)
	}
}

func run(url, token string, duration time.Duration, workers int, marksFile string) error {
	client := &http.Client{Timeout: 5 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				ip := fmt.Sprintf("10.%d.%d.%d", 100+w, n/250, n%250+1)
				r := create(client, url, token, ip)
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
				if r.status != http.StatusCreated {
					time.Sleep(20 * time.Millisecond) // do not spin on a refused connection
				}
			}
		})
	}
	wg.Wait()

	marks, err := readMarks(marksFile)
	if err != nil {
		return err
	}
	slices.SortFunc(results, func(a, b result) int { return a.end.Compare(b.end) })
	for _, name := range []string{"kill", "killed", "promote", "promoted", "ready"} {
		if marks[name].IsZero() {
			return fmt.Errorf("no %q mark in %s", name, marksFile)
		}
	}
	kill, ready := marks["kill"], marks["ready"]
	var acked []string
	var lastBefore, firstAfter result
	failures := map[string]int{}
	between := 0 // acks answered while no primary took writes
	var gap time.Duration
	var prev time.Time
	for _, r := range results {
		if r.status == http.StatusCreated {
			acked = append(acked, r.ip)
			switch {
			case r.end.Before(kill):
				lastBefore = r
			case r.end.Before(ready):
				between++
			case firstAfter.end.IsZero():
				firstAfter = r
			}
			if !prev.IsZero() && r.end.Sub(prev) > gap {
				gap = r.end.Sub(prev)
			}
			prev = r.end
			continue
		}
		key := r.err
		if r.status != 0 {
			key = fmt.Sprintf("HTTP %d", r.status)
		}
		failures[key]++
	}
	ms := func(t time.Time) string {
		return fmt.Sprintf("%+.0f ms", float64(t.Sub(kill))/float64(time.Millisecond))
	}
	fmt.Printf("requests: %d, acknowledged (201): %d, failed: %d\n", len(results), len(acked), len(results)-len(acked))
	for k, n := range failures {
		fmt.Printf("  failed: %d x %s\n", n, k)
	}
	fmt.Printf("last ack before the kill:        t=%s\n", ms(lastBefore.end))
	fmt.Printf("primary killed (kill -9):        t=0 (kill returned at t=%s)\n", ms(marks["killed"]))
	fmt.Printf("promotion requested:             t=%s (pg_ctl promote -w returned at t=%s)\n", ms(marks["promote"]), ms(marks["promoted"]))
	fmt.Printf("promoted standby takes writes:   t=%s (its log: ready to accept connections)\n", ms(ready))
	fmt.Printf("acks answered in between:        %d (committed before the kill, answered after it)\n", between)
	if firstAfter.end.IsZero() {
		return errors.New("no write was acknowledged after the promotion")
	}
	fmt.Printf("first ack after promotion:       t=%s, %.0f ms after the standby took writes\n", ms(firstAfter.end), float64(firstAfter.end.Sub(ready))/float64(time.Millisecond))
	fmt.Printf("longest gap between acks:        %.0f ms (writes unavailable, as the clients saw it)\n", float64(gap)/float64(time.Millisecond))
	var lat []time.Duration
	for _, r := range results {
		if r.status == http.StatusCreated && r.start.After(firstAfter.end) {
			lat = append(lat, r.end.Sub(r.start))
		}
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		fmt.Printf("latency after recovery:          p50 %.1f ms, p99 %.1f ms (%d acks)\n",
			float64(lat[len(lat)/2])/float64(time.Millisecond), float64(lat[len(lat)*99/100])/float64(time.Millisecond), len(lat))
	}

	// Every acknowledged write is on the new primary (registryd can only
	// reach the promoted standby now).
	listed, err := list(client, url, token)
	if err != nil {
		return fmt.Errorf("listing the nodes after the failover: %w", err)
	}
	var lost []string
	for _, ip := range acked {
		if !listed[ip] {
			lost = append(lost, ip)
		}
	}
	fmt.Printf("nodes listed after failover: %d; acknowledged and missing: %d; present but never acknowledged (in flight at the kill): %d\n",
		len(listed), len(lost), len(listed)-(len(acked)-len(lost)))
	if len(lost) > 0 {
		return fmt.Errorf("%d acknowledged writes were lost: %v", len(lost), lost[:min(len(lost), 10)])
	}
	return nil
}

func create(client *http.Client, url, token, ip string) result {
	r := result{ip: ip, start: time.Now()}
	body := fmt.Sprintf(`{"ip":%q,"index":0,"cpu_mem":1,"driver_version":"550","hardware_generation":null,"gpu_mem":null}`, ip)
	req, err := http.NewRequest(http.MethodPost, url+"/v1/nodes/create", strings.NewReader(body))
	if err != nil {
		r.err = err.Error()
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	r.end = time.Now()
	if err != nil {
		r.err = "no answer"
		return r
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	r.status = resp.StatusCode
	return r
}

func list(client *http.Client, url, token string) (map[string]bool, error) {
	var last error
	// registryd may still be reconnecting: a few tries, a second apart.
	for range 10 {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/nodes/list", bytes.NewReader(nil))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			last = err
			time.Sleep(time.Second)
			continue
		}
		var nodes []struct{ IP string }
		err = json.NewDecoder(resp.Body).Decode(&nodes)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil {
			last = fmt.Errorf("HTTP %d: %v", resp.StatusCode, err)
			time.Sleep(time.Second)
			continue
		}
		m := map[string]bool{}
		for _, n := range nodes {
			m[n.IP] = true
		}
		return m, nil
	}
	return nil, last
}

func readMarks(file string) (map[string]time.Time, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]time.Time{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		ns, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("%s: bad line %q", file, sc.Text())
		}
		m[name] = time.Unix(0, ns)
	}
	return m, sc.Err()
}
