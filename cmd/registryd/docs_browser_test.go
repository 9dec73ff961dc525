package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/getkin/kin-openapi/openapi3"

	"github.com/registryd/registryd/internal/pgtest"
)

// chromium finds a Chromium (or Chrome) to drive. Without one the browser
// test is skipped, except in CI (CI=true), where it must run.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	const why = "no chromium, chromium-browser or google-chrome on PATH; the /docs browser test needs one (Debian: apt-get install chromium)"
	if os.Getenv("CI") == "true" {
		t.Fatal(why + "; CI must run it")
	}
	t.Skip(why)
	return ""
}

// specOperations reads the spec the server serves and returns how many
// operation blocks Swagger UI should render (an operation appears under
// each of its tags, untagged ones under "default") and the DOM id of each
// block of an operation with an operationId.
func specOperations(t *testing.T, url string) (blocks int, ids []string, ping string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url + "/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(body)
	if err != nil {
		t.Fatalf("the served openapi.yaml: %v", err)
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			tags := op.Tags
			if len(tags) == 0 {
				tags = []string{"default"}
			}
			blocks += len(tags)
			if op.OperationID == "" {
				continue
			}
			for _, tag := range tags {
				id := "operations-" + tag + "-" + op.OperationID
				ids = append(ids, id)
				if method == http.MethodGet && path == "/v1/nodes/ping" {
					ping = id
				}
			}
		}
	}
	if ping == "" {
		t.Fatal("openapi.yaml has no GET /v1/nodes/ping with an operationId")
	}
	slices.Sort(ids)
	return blocks, ids, ping
}

// The API browser, in a real headless Chromium against a real server:
// every operation of the served spec renders; at 1440×900 "Authorize" is
// on the first screen, nodes come first and the intro's link shows the
// conventions on this page; Node-Id is offered on node operations only;
// the watch says it cannot stream here and offers no "Try it out";
// "Authorize" takes a bearer token, "Try it out" on GET /v1/nodes/ping
// sends it and shows 200, the request goes to the server that serves the
// page (not the spec's default address), and the page runs under its
// Content-Security-Policy without a single violation or console error.
// Then CORS as a browser
// does it: a page of an allowed origin calls the API (preflight, token,
// JSON body) and reads the answer; a page of another origin cannot.
func TestDocsInBrowser(t *testing.T) {
	chrome := chromium(t)
	t.Parallel()
	// A page of another origin, allowed to call the API (CORS), and the
	// same page under another name, which is not.
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, "<!DOCTYPE html><title>an operations console elsewhere</title>")
	}))
	defer elsewhere.Close()
	notAllowed := strings.Replace(elsewhere.URL, "127.0.0.1", "localhost", 1)
	env := map[string]string{"REGISTRY_DATABASE_URL": pgtest.New(t), "REGISTRY_JWT_SECRET": testSecret,
		"REGISTRY_CORS_ORIGINS": elsewhere.URL}
	srv := startServer(t, env)
	out, stderr, err := runCmd(t, env, "token", "--sub", "docs-reader", "--role", "reader")
	if err != nil {
		t.Fatalf("token: %v\n%s", err, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	token := lines[len(lines)-1]
	blocks, ids, ping := specOperations(t, srv.url)

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chrome),
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		// This machine may have no network: nothing but the test server.
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.WindowSize(1440, 900), // a laptop's screen: the first screen below must fit it
	}
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses root otherwise
	}
	start := time.Now()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer func() {
		// Close the browser and wait for it, so no process or goroutine
		// outlives the test.
		ctx, cancel := context.WithTimeout(bctx, 10*time.Second)
		defer cancel()
		_ = chromedp.Cancel(ctx)
		cancelBrowser()
	}()
	// Every step below is bounded by this; the whole test takes seconds.
	ctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()

	// Everything the page writes to its console, and every CSP violation
	// (a listener the page cannot skip: DevTools adds it to every
	// document before the page's own scripts run).
	var (
		mu         sync.Mutex
		messages   []string
		newMessage = make(chan struct{}, 1)
	)
	console := chromedp.Console(ctx)
	consoleDone := make(chan struct{})
	defer func() { cancel(); <-consoleDone }()
	go func() {
		defer close(consoleDone)
		for m, err := range console {
			if err != nil {
				return
			}
			mu.Lock()
			messages = append(messages, m.String()+" ("+m.URL+")")
			mu.Unlock()
			select {
			case newMessage <- struct{}{}:
			default:
			}
		}
	}()
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
		Source: `window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
	window.__cspViolations.push(e.violatedDirective + " blocked " + (e.blockedURI || "inline") + " at " + e.sourceFile + ":" + e.lineNumber);
});`,
	}); err != nil {
		t.Fatalf("start Chromium (%s): %v", chrome, err)
	}
	started := time.Since(start)

	logged := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(messages, "\n")
	}
	step := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			html, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.querySelector(".modal-ux") || document.querySelector(".auth-wrapper") || document.body).outerHTML.slice(0, 5000)`))
			t.Fatalf("%s: %v\npage:\n%s\nconsole:\n%s", what, err, html, logged())
		}
	}

	// The page and every operation of the spec.
	step("open /docs", chromedp.Navigate(srv.url+"/docs"))
	step("wait for the operations",
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.querySelectorAll(".opblock").length >= %d`, blocks), chromedp.WithPollingTimeout(20*time.Second)))
	rendered, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll(".opblock")).map(e => e.id).sort()`))
	if err != nil {
		t.Fatal(err)
	}
	if len(rendered) != blocks {
		t.Errorf("%d operation blocks rendered, the spec has %d", len(rendered), blocks)
	}
	for _, id := range ids {
		if !slices.Contains(rendered, id) {
			t.Errorf("operation %s is not rendered; rendered: %v", id, rendered)
		}
	}
	if n, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll(".errors-wrapper .error-wrapper").length`)); n != 0 {
		t.Errorf("Swagger UI reports %d errors in the spec", n)
	}
	rendering := time.Since(start)

	// The first screen, as a person sees it: Authorize without scrolling,
	// the nodes first, and the conventions behind a link to the end.
	firstScreen, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]any](`(() => {
		const b = document.querySelector(".auth-wrapper .authorize").getBoundingClientRect();
		return {top: b.top, bottom: b.bottom, height: window.innerHeight, scrolled: window.scrollY,
			firstTag: document.querySelector(".opblock-tag").id};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	if top, bottom, height := firstScreen["top"].(float64), firstScreen["bottom"].(float64), firstScreen["height"].(float64); firstScreen["scrolled"] != 0.0 ||
		height > 900 || top < 0 || bottom > height {
		t.Errorf("Authorize is not on the first screen at 1440×900: %v", firstScreen)
	}
	if firstScreen["firstTag"] != "operations-tag-nodes" {
		t.Errorf("the first tag shown is %v, want nodes", firstScreen["firstTag"])
	}
	step("follow the intro's link to the conventions", chromedp.Click(chromedp.CSS(`.info a[href="#/conventions"]`)))
	conventions, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]any](`(() => {
		const c = document.getElementById("operations-tag-conventions");
		return {top: c.getBoundingClientRect().top, height: window.innerHeight, rules: c.innerText.includes("Rules that hold for every endpoint"),
			url: window.location.href};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	if top, height := conventions["top"].(float64), conventions["height"].(float64); top < 0 || top >= height ||
		conventions["rules"] != true || conventions["url"] != srv.url+"/docs" {
		t.Errorf("the link to the conventions does not show them on this page: %v", conventions)
	}
	step("back to the top", chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`))

	// Authorize with a bearer token.
	step("authorize",
		chromedp.Click(chromedp.CSS(".auth-wrapper .authorize")),
		chromedp.WaitVisible(chromedp.CSS(".modal-ux input")),
		chromedp.Focus(chromedp.CSS(".modal-ux input")),
		// Pasted, as a user would: typing it key by key takes seconds.
		func(ctx context.Context, tgt *chromedp.Target) (chromedp.Void, error) {
			_, err := cdp.Call(ctx, tgt, input.InsertText, input.InsertTextParams{Text: token})
			return chromedp.Void{}, err
		},
		chromedp.Click(chromedp.CSS(".modal-ux .auth-btn-wrapper .authorize")),
		chromedp.WaitVisible(chromedp.CSS(`.modal-ux button[aria-label="Remove authorization"]`)), // "Logout": authorized
		chromedp.Click(chromedp.CSS(".modal-ux .btn-done")),
		chromedp.WaitNotPresent(chromedp.CSS(".modal-ux")),
		chromedp.WaitVisible(chromedp.CSS(".auth-wrapper .authorize.locked")),
	)

	// Try it out: GET /v1/nodes/ping, with the token.
	op := "#" + ping
	step("try it out",
		chromedp.Click(chromedp.CSS(op+" .opblock-summary-control")),
		chromedp.WaitVisible(chromedp.CSS(op+" .try-out__btn")),
		chromedp.Click(chromedp.CSS(op+" .try-out__btn")),
		chromedp.WaitVisible(chromedp.CSS(op+" .execute")),
	)
	// Swagger UI fills optional parameters with the spec's examples; this
	// ping is a plain reader's, so it sends none (a Node-Id from a reader
	// would be refused).
	params, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](
		`Object.fromEntries(Array.from(document.querySelectorAll("`+op+` .parameters tr[data-param-name] input")).map(e => [e.closest("tr").dataset.paramName, e.value]))`))
	if err != nil {
		t.Fatal(err)
	}
	for name, value := range params {
		input := chromedp.CSS(op + ` .parameters tr[data-param-name="` + name + `"] input`)
		if value != "" {
			// Typed away, as a user would: React keeps its own copy of the value.
			step("clear parameter "+name, chromedp.SendKeys(input, kb.End+strings.Repeat(kb.Backspace, len(value))))
		}
		if v, _ := chromedp.Run(ctx, chromedp.Value(input)); v != "" {
			t.Fatalf("parameter %s still holds %q", name, v)
		}
	}
	step("execute",
		chromedp.Click(chromedp.CSS(op+" .execute")),
		chromedp.WaitVisible(chromedp.CSS(op+" .live-responses-table tr.response .response-col_status")),
	)
	status, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(op+" .live-responses-table tr.response .response-col_status")))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(op+" .live-responses-table tr.response .response-col_description")))
	if !strings.HasPrefix(strings.TrimSpace(status), "200") || !strings.Contains(body, `"status": "ok"`) {
		t.Errorf("Try it out on GET /v1/nodes/ping: status %q, body %q; want 200 and the ping", status, body)
	}
	// The request the UI shows (and sent) went to this server, with the
	// token.
	curl, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(op+" .curl-command")))
	if !strings.Contains(curl, srv.url+"/v1/nodes/ping") || !strings.Contains(curl, "Authorization: Bearer "+token) {
		t.Errorf("the request Swagger UI made is not to %s with the token:\n%s", srv.url, curl)
	}

	// Node-Id is offered where acting as a node means something: on a
	// node's own operations, not on hardware, audit, tokens or fabrics.
	for _, tc := range []struct {
		id     string
		nodeID bool
	}{
		{"operations-nodes-getNode", true}, {"operations-nodes-patchNode", true},
		{"operations-hardware-listHardware", false}, {"operations-audit-listAudit", false},
		{"operations-tokens-revokeTokens", false}, {"operations-nodes-listFabrics", false},
	} {
		op := "#" + tc.id
		step("try out "+tc.id,
			chromedp.Click(chromedp.CSS(op+" .opblock-summary-control")),
			chromedp.WaitVisible(chromedp.CSS(op+" .try-out__btn")),
			chromedp.Click(chromedp.CSS(op+" .try-out__btn")),
			chromedp.WaitVisible(chromedp.CSS(op+" .execute")),
		)
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("`+op+` .parameters tr[data-param-name='Node-Id'] input").length`))
		if err != nil {
			t.Fatal(err)
		}
		if got := n == 1; got != tc.nodeID || n > 1 {
			t.Errorf("%s: %d Node-Id inputs, want it offered: %v", tc.id, n, tc.nodeID)
		}
	}

	// The watch, a stream Swagger UI cannot show, says so and offers no
	// "Try it out" (which would spin forever).
	watch := "#operations-nodes-watchNodes"
	step("open the watch",
		chromedp.Click(chromedp.CSS(watch+" .opblock-summary-control")),
		chromedp.WaitVisible(chromedp.CSS(watch+" .opblock-section-header")),
	)
	said, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]any](`({
		text: document.querySelector("`+watch+` .opblock-description-wrapper").innerText.slice(0, 300),
		tryOut: document.querySelectorAll("`+watch+` .try-out__btn").length})`))
	if err != nil {
		t.Fatal(err)
	}
	if text, _ := said["text"].(string); !strings.HasPrefix(text, "Swagger UI cannot show this stream") || !strings.Contains(text, "curl -N") ||
		said["tryOut"] != 0.0 {
		t.Errorf("the watch operation: %v; want it to open with why Swagger UI cannot show it and a curl line, and no Try it out", said)
	}

	violations, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.__cspViolations`))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range violations {
		t.Errorf("CSP violation: %s", v)
	}
	mu.Lock()
	docsConsole := slices.Clone(messages)
	mu.Unlock()
	for _, m := range docsConsole {
		if strings.HasPrefix(m, "error:") || strings.HasPrefix(m, "exception:") || strings.Contains(m, "Content Security Policy") {
			t.Errorf("console: %s", m)
		}
	}
	docsDone := time.Since(start)

	// CORS, in the browser: the allowed origin's page calls the API with a
	// token and a JSON body (so the browser sends a preflight first) and
	// reads the answer and the headers it needs; the other origin's page
	// gets nothing.
	fetch := fmt.Sprintf(`fetch(%q, {method: "POST", headers: {"Authorization": "Bearer " + %q, "Content-Type": "application/json"}, body: "{}"})
		.then(r => r.status + " " + (r.headers.get("X-Request-Id") ? "request id" : "no request id"), e => "refused: " + e.message)`,
		srv.url+"/v1/nodes/list", token)
	step("open a page of an allowed origin", chromedp.Navigate(elsewhere.URL))
	if got, err := chromedp.Run(ctx, chromedp.Evaluate[string](fetch, chromedp.EvalAwaitPromise)); err != nil || got != "200 request id" {
		t.Errorf("fetch from %s, an allowed origin: %q, %v", elsewhere.URL, got, err)
	}
	step("open a page of another origin", chromedp.Navigate(notAllowed))
	if got, err := chromedp.Run(ctx, chromedp.Evaluate[string](fetch, chromedp.EvalAwaitPromise)); err != nil || !strings.HasPrefix(got, "refused:") {
		t.Errorf("fetch from %s, not an allowed origin: %q, %v", notAllowed, got, err)
	}
	// Chromium logs why; the message may come just after the refusal.
	reported := time.After(5 * time.Second)
	for !strings.Contains(logged(), "CORS policy") {
		select {
		case <-newMessage:
		case <-reported:
			t.Fatalf("the browser did not report the refusal as CORS; console:\n%s", logged())
		}
	}

	t.Logf("Chromium started in %s; every operation rendered after %s; authorized, tried and checked after %s; CORS checked after %s",
		started.Round(time.Millisecond), rendering.Round(time.Millisecond), docsDone.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}
