// Charts of the dashboard's pages: each .chart element names its model and metric; the grid around it names
// the JSON to poll (data-series) and how often (data-refresh, seconds). No inline script: the pages'
// Content-Security-Policy allows scripts from the dashboard's own static files only.
(function () {
  "use strict";
  var COLOURS = ["#2563eb", "#d97706", "#059669", "#7c3aed", "#dc2626"];

  function width(el) { return Math.max(240, el.clientWidth || 320); }

  function aliasesOf(data) { return data && data.aliases ? Object.keys(data.aliases).sort() : []; }

  function alignedRps(data) {
    // The server puts every alias on one time axis (data.at), null where an alias has no point.
    var aliases = aliasesOf(data);
    if (!aliases.length) { return null; }
    var series = [data.at];
    aliases.forEach(function (a) { series.push(data.aliases[a].rps); });
    return { labels: aliases, data: series };
  }

  function alignedLatency(data) {
    var aliases = aliasesOf(data);
    if (!aliases.length) { return null; }
    var series = [data.at], labels = [];
    aliases.forEach(function (a) {
      series.push(data.aliases[a].p50_ms); labels.push(a + " p50");
      series.push(data.aliases[a].p99_ms); labels.push(a + " p99");
    });
    return { labels: labels, data: series };
  }

  function alignedDrift(data) {
    // Prediction and input reports come from the same runs but may differ in count: put both on one x axis.
    var kinds = Object.keys(data).sort();
    if (!kinds.length) { return null; }
    var times = {};
    kinds.forEach(function (k) { data[k].at.forEach(function (t) { times[t] = true; }); });
    var xs = Object.keys(times).map(Number).sort(function (a, b) { return a - b; });
    var series = [xs];
    kinds.forEach(function (k) {
      var byTime = {};
      data[k].at.forEach(function (t, i) { byTime[t] = data[k].score[i]; });
      series.push(xs.map(function (t) { return t in byTime ? byTime[t] : null; }));
    });
    return { labels: kinds, data: series };
  }

  var SHAPES = { rps: alignedRps, latency: alignedLatency, drift: alignedDrift };

  function draw(el, shaped) {
    var key = shaped.labels.join("|");
    if (el._plot && el._key === key) { el._plot.setData(shaped.data); return; }
    if (el._plot) { el._plot.destroy(); }
    el.textContent = "";
    var opts = {
      width: width(el), height: 180,
      series: [{}].concat(shaped.labels.map(function (label, i) {
        return { label: label, stroke: COLOURS[i % COLOURS.length], width: 1.5, spanGaps: true };
      })),
      axes: [{}, { size: 50 }],
      scales: {
        x: { time: true },
        y: el.dataset.metric === "drift" ? { range: [0, 1] } : { range: function (u, min, max) { return [0, Math.max(1, max || 0)]; } },
      },
    };
    el._plot = new uPlot(opts, shaped.data, el);
    el._key = key;
  }

  function refresh(grid) {
    fetch(grid.dataset.series, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        // The session is gone (serving restarted, the identity revoked): log in again rather than freeze.
        if (r.status === 401) { window.location.assign("/dashboard/login?expired=1"); return null; }
        return r.ok ? r.json() : null;
      })
      .then(function (all) {
        if (!all) { return; }
        grid.querySelectorAll(".chart").forEach(function (el) {
          var shaped = SHAPES[el.dataset.metric]((all[el.dataset.model]) || {});
          // uPlot spreads a lone point over years of time axis: a line starts at two points.
          var points = shaped ? shaped.data[0].length : 0;
          if (points > 1) { draw(el, shaped); }
          else if (!el._plot) { el.textContent = points ? "one point so far" : "no data yet"; }
        });
      })
      .catch(function () { /* the next tick tries again */ });
  }

  // A confirmation form is sent once: its button is disabled as it submits (the server refuses a second
  // POST of the same one-time token anyway).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.hasAttribute && form.hasAttribute("data-once")) {
      form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-series]").forEach(function (grid) {
      refresh(grid);
      var every = Number(grid.dataset.refresh || 5) * 1000;
      setInterval(function () { if (!document.hidden) { refresh(grid); } }, every);
    });
    window.addEventListener("resize", function () {
      document.querySelectorAll(".chart").forEach(function (el) {
        if (el._plot) { el._plot.setSize({ width: width(el), height: 180 }); }
      });
    });
  });
})();
