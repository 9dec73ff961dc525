// registryd's Swagger UI setup, at /docs. A file of its own rather than an
// inline script, so that the page's Content-Security-Policy can refuse
// every inline script.
"use strict";
(function () {
	// This page is /docs of a registryd; the contract and the API are its
	// siblings. Relative, so a proxy's path prefix is kept.
	var root = new URL(".", window.location.href);
	var api = root.href.replace(/\/$/, "");

	// openapi.yaml names the default listen address as its server. The UI
	// talks to the registryd that serves it instead (the only origin the
	// page's CSP lets it connect to): the spec it shows names this server,
	// so "Try it out" and the curl lines it prints use it.
	function sameServer() {
		return {
			statePlugins: {
				spec: {
					wrapActions: {
						updateJsonSpec: function (ori) {
							return function (json) {
								if (json && typeof json === "object" && !Array.isArray(json)) {
									json = Object.assign({}, json, {
										servers: [{ url: api, description: "this registryd (the server of this page)" }],
									});
								}
								return ori(json);
							};
						},
					},
				},
			},
		};
	}

	// Swagger UI shows an answer once it ends; an event stream (the
	// watch) never does, and "Try it out" would spin forever. Such an
	// operation gets no "Try it out": its description gives the curl line.
	function streamsNoTry() {
		return {
			statePlugins: {
				spec: {
					selectors: {
						allowTryItOutFor: function (state, path, method) {
							var op = state.getIn(["resolvedSubtrees", "paths", path, method]) || state.getIn(["json", "paths", path, method]);
							var content = op && op.getIn(["responses", "200", "content"]);
							return !(content && content.has("text/event-stream"));
						},
					},
				},
			},
		};
	}

	// The spec links to its own sections by tag ([conventions](#/conventions)).
	// Swagger UI opens every Markdown link in a new tab, which would lose
	// the token given under "Authorize": scroll this page instead.
	document.addEventListener("click", function (e) {
		var link = e.target.closest && e.target.closest('#swagger-ui a[href^="#/"]');
		var tag = link && document.getElementById("operations-tag-" + link.getAttribute("href").slice(2));
		if (tag) {
			e.preventDefault();
			tag.scrollIntoView();
		}
	});

	window.ui = SwaggerUIBundle({
		url: new URL("openapi.yaml", root).href,
		dom_id: "#swagger-ui",
		presets: [SwaggerUIBundle.presets.apis],
		plugins: [sameServer, streamsNoTry],
		layout: "BaseLayout",
		deepLinking: true,
		displayRequestDuration: true,
		// No third-party validator badge (it would send the spec's URL
		// elsewhere), no configuration from the query string.
		validatorUrl: null,
		queryConfigEnabled: false,
		// A token entered under "Authorize" lives in this tab's memory
		// only: never in localStorage, where any script of this origin
		// could read it later.
		persistAuthorization: false,
		// "Try it out" sends real requests, writes included: an explicit
		// click per operation.
		tryItOutEnabled: false,
	});
})();
