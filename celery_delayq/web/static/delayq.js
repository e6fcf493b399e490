// celery_delayq web page: the one script. Every page works without it (server-rendered, forms post);
// with it: "are you sure?" before actions, times in UTC or the browser's zone, a page that keeps itself
// current, and the overview's charts. No framework, nothing from another site (uPlot is vendored).
(function () {
  "use strict";
  var store = {
    get: function (k, d) { try { return window.localStorage.getItem(k) || d; } catch (e) { return d; } },
    set: function (k, v) { try { window.localStorage.setItem(k, v); } catch (e) { /* private mode */ } }
  };

  // -- ask before every action: forms with data-confirm ---------------------------------------------
  document.addEventListener("submit", function (event) {
    var form = event.target.closest("form[data-confirm]");
    if (form && !window.confirm(form.getAttribute("data-confirm"))) { event.preventDefault(); }
  });

  // -- times: <time datetime="ISO"> shown in UTC or this browser's zone, with the relative time beside --
  var zone = store.get("delayq.tz", "utc");
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function zoneName(d) {
    try {
      var part = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" }).formatToParts(d)
        .filter(function (p) { return p.type === "timeZoneName"; })[0];
      return part ? part.value : "local";
    } catch (e) { return "local"; }
  }
  function absolute(d, z) {
    if (z === "utc") {
      return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " +
        pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds()) + " UTC";
    }
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + " " + zoneName(d);
  }
  function clock(d, z) { return absolute(d, z).slice(11); }
  function relative(seconds) {  // seconds from now: negative is past
    var s = Math.abs(seconds), words;
    if (s < 1) { return "now"; }
    if (s < 60) { words = Math.round(s) + " s"; }
    else if (s < 3600) { words = Math.round(s / 60) + " min"; }
    else if (s < 172800) { words = (s / 3600).toFixed(s < 36000 ? 1 : 0) + " h"; }
    else { words = Math.round(s / 86400) + " d"; }
    return seconds < 0 ? words + " ago" : "in " + words;
  }
  var skew = 0;  // server clock minus this browser's, from the change signal
  function serverNow() { return Date.now() / 1000 + skew; }
  function renderTimes(root) {
    (root || document).querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d.getTime())) { return; }
      el.textContent = absolute(d, zone);
      el.title = absolute(d, zone === "utc" ? "local" : "utc");
      var rel = el.nextElementSibling;
      if (!rel || !rel.classList.contains("rel")) {
        rel = document.createElement("span");
        rel.className = "rel";
        el.after(rel);
      }
      rel.textContent = "(" + relative(d.getTime() / 1000 - serverNow()) + ")";
    });
  }
  function showZone() {
    document.querySelectorAll("[data-tz-toggle]").forEach(function (b) {
      b.textContent = zone === "utc" ? "UTC" : "Local time";
      b.setAttribute("aria-label", "Times in " + (zone === "utc" ? "UTC" : "this browser's zone") +
        "; switch to " + (zone === "utc" ? "local time" : "UTC"));
    });
  }
  document.addEventListener("click", function (event) {
    if (!event.target.closest("[data-tz-toggle]")) { return; }
    zone = zone === "utc" ? "local" : "utc";
    store.set("delayq.tz", zone);
    showZone(); renderTimes(); updateAge(); charts.redraw();
  });

  // -- live: poll the change signal, swap <main> when the page is out of date ----------------------
  var main = document.querySelector("main");
  var liveUrl = main && main.getAttribute("data-live-url");
  var live = document.querySelector("[data-live]");
  var paused = store.get("delayq.live", "on") === "paused";
  var shownAt = main ? parseFloat(main.getAttribute("data-rendered-at") || "0") : 0;
  var shownReadAt = null;  // when the index behind what is shown was read
  var lastSignal = null, failing = false, timer = null, fetching = false;

  function busy() {  // the operator is typing, selecting or has ticked boxes: do not pull the page away
    var active = document.activeElement;
    var m = document.querySelector("main");
    if (!m) { return true; }
    if (active && m.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) { return true; }
    if (m.querySelector("input[type=checkbox]:checked")) { return true; }
    var dirty = Array.prototype.some.call(m.querySelectorAll("input:not([type=hidden]):not([type=checkbox])"),
      function (i) { return i.value !== i.defaultValue; });
    if (dirty) { return true; }
    var sel = window.getSelection && window.getSelection();
    return !!(sel && !sel.isCollapsed && m.contains(sel.anchorNode));
  }

  function updateAge() {
    if (!live) { return; }
    var label = live.querySelector("[data-live-label]"), ageEl = live.querySelector("[data-live-age]");
    var toggle = live.querySelector("[data-live-toggle]");
    toggle.textContent = paused ? "Resume" : "Pause";
    toggle.setAttribute("aria-pressed", paused ? "true" : "false");
    live.classList.toggle("paused", paused);
    live.classList.toggle("down", failing);
    if (shownReadAt === null) { ageEl.textContent = ""; label.textContent = paused ? "paused" : "live"; return; }
    var age = Math.max(0, serverNow() - shownReadAt);
    var refresh = lastSignal ? lastSignal.refresh_s : 3;
    live.classList.toggle("stale", age > refresh);
    label.textContent = failing ? "offline" : paused ? "paused" : "live";
    ageEl.textContent = "as of " + clock(new Date(shownReadAt * 1000), zone) + " · " + Math.floor(age) + " s old";
    ageEl.title = "The waiting list and parked count behind this page were read " + Math.floor(age) + " s ago";
  }

  function swap(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    var fresh = doc.querySelector("main");
    var old = document.querySelector("main");
    if (!fresh || !old) { return false; }
    // Keep the keyboard's place: the same element (kept) or the one at the same place in the new page.
    var active = document.activeElement, restore = null;
    if (active && active !== old && old.contains(active)) {
      restore = { node: active, tag: active.tagName,
                  index: Array.prototype.indexOf.call(old.querySelectorAll(active.tagName), active) };
    }
    fresh.querySelectorAll("[data-keep][id]").forEach(function (el) {  // charts stay as they are
      var kept = document.getElementById(el.id);
      if (kept) { el.replaceWith(kept); }
    });
    old.replaceWith(fresh);
    main = fresh;
    if (restore) {
      var target = fresh.contains(restore.node) ? restore.node : fresh.querySelectorAll(restore.tag)[restore.index];
      if (target && target.focus) { target.focus({ preventScroll: true }); }
    }
    document.title = doc.title || document.title;
    shownAt = parseFloat(fresh.getAttribute("data-rendered-at") || "0");
    renderTimes(fresh);
    charts.start();
    return true;
  }

  function refresh(signal) {
    if (fetching) { return; }
    fetching = true;
    fetch(window.location.href, { headers: { "Accept": "text/html" }, credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.redirected && /\/login(\?|$)/.test(new URL(r.url).pathname + "?")) { window.location.reload(); }
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.text();
      })
      .then(function (html) {  // typing may have begun while it was fetched: then the next poll tries again
        if (!busy() && swap(html)) { shownReadAt = signal.read_at; }
      })
      .catch(function () { failing = true; })
      .then(function () { fetching = false; updateAge(); });
  }

  function poll() {
    timer = null;
    if (paused || !liveUrl) { return; }
    fetch(liveUrl, { headers: { "Accept": "application/json" }, credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status === 401) { failing = true; paused = true; updateAge(); throw new Error("logged out"); }
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(function (signal) {
        failing = false;
        lastSignal = signal;
        skew = signal.now - Date.now() / 1000;
        if (signal.changed_at > shownAt) {
          if (!busy()) { refresh(signal); }
        } else if (signal.read_at !== null) {
          shownReadAt = signal.read_at;  // nothing changed since the page was drawn: it is this current
        }
        updateAge();
        schedule((signal.poll_s || 1) * 1000);
      })
      .catch(function () { failing = true; updateAge(); if (!paused) { schedule(5000); } });
  }
  function schedule(ms) { if (timer === null && !paused) { timer = window.setTimeout(poll, ms); } }

  if (live && liveUrl) {
    live.hidden = false;
    live.querySelector("[data-live-toggle]").addEventListener("click", function () {
      paused = !paused;
      store.set("delayq.live", paused ? "paused" : "on");
      if (timer !== null) { window.clearTimeout(timer); timer = null; }
      if (!paused) { failing = false; poll(); }
      updateAge();
    });
    poll();
  }
  window.setInterval(function () { updateAge(); renderTimes(); }, 1000);

  // -- charts (overview): uPlot over /api/series --------------------------------------------------
  var charts = (function () {
    var plots = {}, data = null, win = store.get("delayq.window", "1h"), seriesTimer = null;
    function css(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }
    function box() { return document.getElementById("charts"); }
    function seconds(v) {  // a lateness for an axis or the legend
      if (v === null || v === undefined) { return "–"; }
      if (v >= 60) { return (v / 60).toFixed(v >= 600 ? 0 : 1) + " min"; }
      if (v >= 1) { return v.toFixed(v >= 10 ? 0 : 1) + " s"; }
      return Math.round(v * 1000) + " ms";
    }
    function tick(ts, span) {  // an x label in the zone shown: the time of day, or the day over a week
      var text = absolute(new Date(ts * 1000), zone);
      return span > 2 * 86400 ? text.slice(5, 10) : text.slice(11, 16);
    }
    function axes(latency) {
      var grid = { stroke: css("--line"), width: 1 };
      return [
        { stroke: css("--muted"), grid: grid, ticks: grid, size: 36,
          values: function (u, splits) {
            var span = u.scales.x.max - u.scales.x.min;
            return splits.map(function (ts) { return tick(ts, span); });
          } },
        { stroke: css("--muted"), grid: grid, ticks: grid, size: 60,
          values: function (u, vals) {
            return vals.map(function (v) { return latency ? seconds(v) : String(v); });
          } }
      ];
    }
    function tz() {
      return zone === "utc" ? function (ts) { return uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"); }
                            : function (ts) { return new Date(ts * 1000); };
    }
    function draw() {
      var el = box();
      if (!el || !data || !window.uPlot) { return; }
      Object.keys(plots).forEach(function (k) { plots[k].destroy(); });
      plots = {};
      var note = el.querySelector("[data-chart-note]");
      if (!data.available) { note.textContent = data.reason || "no telemetry"; }
      else {
        note.textContent = "From " + data.files + " event file(s) under delayq_telemetry_dir, " +
          (data.step_s / 60) + "-minute buckets" + (data.truncated ? "; only the newest 64 MB were read" : "") + ".";
      }
      var specs = {
        counts: { latency: false, series: [["scheduled", "--c-scheduled"], ["delivered", "--c-delivered"],
                                    ["retried", "--c-retried"], ["parked", "--c-parked"]],
                  values: function (name) { return (data.counts || {})[name] || []; } },
        lateness: { latency: true, series: [["p50", "--c-p50"], ["p99", "--c-p99"]],
                    values: function (name) { return data["lateness_" + name + "_s"] || []; } }
      };
      Object.keys(specs).forEach(function (key) {
        var target = el.querySelector('[data-chart="' + key + '"]');
        if (!target) { return; }
        var spec = specs[key];
        var rows = [data.t || []];
        var series = [{}];
        var points = 0;
        spec.series.forEach(function (s) {
          var vals = spec.values(s[0]).map(function (v) { return v === undefined ? null : v; });
          points += vals.filter(function (v) { return v !== null && v !== 0; }).length;
          rows.push(vals);
          series.push({ label: s[0], stroke: css(s[1]), width: 1.5, spanGaps: false,
                        points: { show: data.t && data.t.length <= 96, size: 4 },
                        value: function (u, v) { return spec.latency ? seconds(v) :
                          (v === null || v === undefined ? "–" : String(v)); } });
        });
        target.setAttribute("data-points", String(points));
        var width = Math.max(200, target.clientWidth || el.clientWidth || 300);
        plots[key] = new uPlot({ width: width, height: 180, series: series, axes: axes(spec.latency), tzDate: tz(),
                                 scales: { x: { time: true },
                                           y: { range: function (u, min, max) { return [0, max > 0 ? max * 1.1 : 1]; } } },
                                 legend: { live: true },
                                 cursor: { drag: { x: false, y: false } } }, rows, target);
      });
    }
    function load() {
      var el = box();
      if (!el) { return; }
      seriesTimer = null;
      fetch(el.getAttribute("data-series-url") + "?window=" + encodeURIComponent(win),
            { headers: { "Accept": "application/json" }, credentials: "same-origin", cache: "no-store" })
        .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
        .then(function (doc) { data = doc; draw(); })
        .catch(function () { var n = el.querySelector("[data-chart-note]"); if (n) { n.textContent = "Could not read the series."; } })
        .then(function () { seriesTimer = window.setTimeout(load, win === "1h" ? 15000 : 60000); });
    }
    function pressed() {
      document.querySelectorAll("[data-window]").forEach(function (b) {
        b.setAttribute("aria-pressed", b.getAttribute("data-window") === win ? "true" : "false");
      });
    }
    document.addEventListener("click", function (event) {
      var b = event.target.closest("[data-window]");
      if (!b) { return; }
      win = b.getAttribute("data-window");
      store.set("delayq.window", win);
      pressed();
      if (seriesTimer !== null) { window.clearTimeout(seriesTimer); }
      load();
    });
    var resizing = null;
    window.addEventListener("resize", function () {
      window.clearTimeout(resizing);
      resizing = window.setTimeout(draw, 150);
    });
    if (window.matchMedia) {
      var dark = window.matchMedia("(prefers-color-scheme: dark)");
      if (dark.addEventListener) { dark.addEventListener("change", draw); }
    }
    return {
      start: function () { if (box() && seriesTimer === null && data === null) { pressed(); load(); } },
      redraw: draw
    };
  })();

  function ready() { showZone(); renderTimes(); updateAge(); charts.start(); }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", ready); } else { ready(); }
  window.addEventListener("load", function () { charts.start(); charts.redraw(); });
})();
