// agora-pg dashboard: the token (kept in this tab's sessionStorage), htmx requests with
// it, charts, and live updates from GET /events (read with fetch, so that the token can
// go in a header rather than in the URL).
(function () {
  "use strict";
  var TOKEN_KEY = "agora-pg-token";
  var lastEventId = null;
  var refreshTimer = null;

  function token() { return sessionStorage.getItem(TOKEN_KEY); }
  function headers() {
    var t = token();
    return t ? { Authorization: "Bearer " + t } : {};
  }

  function toast(text, kind) {
    var box = document.getElementById("toasts");
    var item = document.createElement("p");
    item.className = "toast " + (kind || "");
    item.textContent = text;
    box.appendChild(item);
    setTimeout(function () { item.remove(); }, 6000);
  }

  function askForToken() {
    var dialog = document.getElementById("token-dialog");
    if (!dialog.open) { dialog.showModal(); }
  }

  function setLive(text, state) {
    var live = document.getElementById("live");
    live.textContent = text;
    live.dataset.state = state;
  }

  function refresh() {  // at most once a second, however many events arrive
    if (refreshTimer !== null) { return; }
    refreshTimer = setTimeout(function () {
      refreshTimer = null;
      htmx.trigger(document.body, "agora:refresh");
    }, 1000);
  }

  function showProgress(event) {
    var report = event.progress || {};
    document.querySelectorAll('[data-progress-job="' + event.job_id + '"]').forEach(function (box) {
      box.hidden = false;
      var bar = box.querySelector("progress");
      bar.max = report.total || Math.max(report.done || 0, 1);
      bar.value = report.done || 0;
      // "3 / 5" joined by no-break spaces: one line, as the server renders it
      var text = String(report.done) + (report.total ? "\u00a0/\u00a0" + report.total : "") +
        (report.message ? " · " + report.message : "");
      box.querySelector(".progress-text").textContent = text;
    });
  }

  function handle(name, data) {
    if (name === "ping") { return; }
    var event = JSON.parse(data);
    if (name === "job.progress") { showProgress(event); return; }
    refresh();
  }

  async function follow() {
    var extra = lastEventId ? { "Last-Event-ID": lastEventId } : {};
    try {
      var response = await fetch("/events", { headers: Object.assign(extra, headers()) });
      if (response.status === 401) { setLive("token needed", "off"); askForToken(); return; }
      if (!response.ok) { throw new Error("HTTP " + response.status); }
      setLive("live", "on");
      refresh();  // what changed while not listening
      var reader = response.body.getReader();
      var decoder = new TextDecoder();
      var buffer = "";
      for (;;) {
        var chunk = await reader.read();
        if (chunk.done) { break; }
        buffer += decoder.decode(chunk.value, { stream: true });
        var end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          var frame = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          var name = null, data = "";
          frame.split("\n").forEach(function (line) {
            var colon = line.indexOf(":");
            if (colon <= 0) { return; }
            var field = line.slice(0, colon), value = line.slice(colon + 1).replace(/^ /, "");
            if (field === "id") { lastEventId = value; }
            else if (field === "event") { name = value; }
            else if (field === "data") { data += value; }
          });
          if (name) { handle(name, data); }
        }
      }
    } catch (error) {
      setLive("reconnecting…", "off");
    }
    setTimeout(follow, 2000);
  }

  function drawCharts(root) {
    root.querySelectorAll("[data-chart]").forEach(function (box) {
      var data = JSON.parse(box.dataset.chart);
      box.replaceChildren();
      new uPlot({
        width: Math.max(box.clientWidth, 280), height: 160,
        series: [{}, { label: "succeeded", stroke: "#2e7d32", fill: "rgba(46,125,50,0.15)" },
                 { label: "failed", stroke: "#c62828" }],
        axes: [{}, { size: 40 }],
      }, data, box);
    });
  }

  // At once, not at DOMContentLoaded: htmx sends each page's first fragment request from
  // its own DOMContentLoaded handler, which runs before a later one (that request went
  // out without the saved token, got 401 and opened the token dialog on every page).
  document.addEventListener("htmx:configRequest", function (event) {
    Object.assign(event.detail.headers, headers());
  });

  document.addEventListener("DOMContentLoaded", function () {
    document.getElementById("token-form").addEventListener("submit", function () {
      sessionStorage.setItem(TOKEN_KEY, document.getElementById("token-input").value.trim());
      htmx.trigger(document.body, "agora:refresh");
      follow();
    });
    var filters = document.getElementById("filters");
    if (filters) {  // the page's URL follows its filters: a filtered view can be bookmarked and shared
      filters.addEventListener("change", function () {
        var query = new URLSearchParams();
        new FormData(filters).forEach(function (value, name) { if (value) { query.set(name, value); } });
        var search = query.toString();
        history.replaceState(null, "", filters.dataset.pageUrl + (search ? "?" + search : ""));
      });
    }
    document.body.addEventListener("htmx:afterSwap", function (event) {
      event.detail.target.removeAttribute("aria-busy");
      drawCharts(event.detail.target);
      // (a style attribute in the markup would need the CSP to allow inline styles)
      event.detail.target.querySelectorAll("[data-share]").forEach(function (bar) {
        bar.style.setProperty("--share", bar.dataset.share);
      });
    });
    document.body.addEventListener("htmx:afterRequest", function (event) {
      var source = event.detail.elt;
      if (event.detail.successful && source.dataset && source.dataset.done) {
        toast(source.dataset.done, "ok");
        htmx.trigger(document.body, "agora:refresh");
      }
    });
    document.body.addEventListener("htmx:responseError", function (event) {
      var xhr = event.detail.xhr;
      if (xhr.status === 401) { askForToken(); return; }
      var detail = "";
      try { detail = JSON.parse(xhr.responseText).detail; } catch (e) { detail = xhr.statusText; }
      toast(xhr.status + ": " + detail, "error");
    });
    follow();
  });
})();
