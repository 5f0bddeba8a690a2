/* spotwise dashboard and report: draws the JSON in #data, and redraws it on each server-sent
 * event when the page is live. Talks to nothing but its own origin. */
(function () {
  "use strict";
  const body = document.body;
  const live = body.dataset.live === "1";
  const main = document.getElementById("main");
  let data = JSON.parse(document.getElementById("data").textContent);
  let charts = [];
  // the cancel's answer outlives redraws: each live update rebuilds the page
  let cancelNote = null;

  const KIND_COLOURS = {
    useful: "#16a34a", lost: "#dc2626", restore: "#7c3aed", changeover: "#9ca3af",
    idle: "#e5e7eb",
  };
  const MARKET_COLOURS = { spot: "#2563eb", "on-demand": "#ea580c" };
  const SVG = "http://www.w3.org/2000/svg";
  const HUGE = 1e15;
  const HUGE_STEPS = [];
  for (let e = -16; e <= 307; e++) for (const m of [1, 2, 5]) HUGE_STEPS.push(m * 10 ** e);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v);
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c);
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text) node.textContent = text;
    return node;
  }

  /* a number the server could not send (NaN, Infinity: null in JSON) shows as "-" */
  const known = (x) => typeof x === "number" && isFinite(x);
  const usd = (x) => (!known(x) ? "-" : (x < 0 ? "-$" : "$") + Math.abs(x).toFixed(2));
  const pct = (x) => (!known(x) ? "-" : (100 * x).toFixed(1) + "%");
  function dur(s) {
    if (!known(s)) return "-";
    const a = Math.abs(s), sign = s < 0 ? "-" : "";
    if (a < 120) return sign + a.toFixed(1) + " s";
    if (a < 7200) return sign + (a / 60).toFixed(1) + " min";
    return sign + (a / 3600).toFixed(1) + " h";
  }
  const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "-");

  function cell(cls, text, value) {
    return el("td", { class: cls, "data-value": value === undefined ? null : String(value),
                      text: text });
  }

  function stateBadge(state) {
    return el("span", { class: "state state-" + state.toLowerCase(), text: state });
  }

  /* --- the jobs page --------------------------------------------------------------------- */
  function renderJobs(rows) {
    const head = el("tr", {}, ...["job", "state", "attempts", "preemptions", "cost",
      "on-demand", "saved", "deadline", "controller"].map((h) => el("th", { text: h })));
    const table = el("table", { id: "jobs" }, el("thead", {}, head));
    const tbody = el("tbody");
    for (const r of rows) {
      const link = el("a", { href: live ? "/job/" + encodeURIComponent(r.id) : null,
                             text: r.id });
      const deadline = r.deadline_at ? when(r.deadline_at) : "-";
      tbody.append(el("tr", { "data-job": r.id },
        el("td", { class: "id" }, link),
        el("td", { class: "state-cell", "data-value": r.state }, stateBadge(r.state)),
        cell("attempts", String(r.attempts), r.attempts),
        cell("preemptions", String(r.preemptions), r.preemptions),
        cell("cost", usd(r.cost_usd), r.cost_usd),
        cell("ondemand", usd(r.ondemand_cost_usd), r.ondemand_cost_usd),
        cell("savings", usd(r.savings_usd), r.savings_usd),
        cell("deadline", deadline, r.deadline_at),
        cell("controller", r.controller_alive ? "running" : (r.terminal ? "-" : "stopped"))));
    }
    table.append(tbody);
    main.replaceChildren(el("h1", { text: "Jobs" }),
      rows.length ? table : el("p", { class: "muted", text: "no jobs yet: spotwise launch JOB.yaml" }));
  }

  /* --- the job page ---------------------------------------------------------------------- */
  function stat(label, value, id) {
    return el("div", { class: "stat", id: id }, el("div", { class: "label", text: label }),
              el("div", { class: "value", text: value }));
  }

  function cancelButton(d) {
    if (!live || d.row.terminal) return null;
    const button = el("button", { id: "cancel", class: "danger", text: "Cancel job",
      onclick: async () => {
        if (!window.confirm("Cancel job " + d.row.id + "? The running attempt saves and stops."))
          return;
        cancelNote = "sending...";
        render();
        try {
          const r = await fetch("/api/jobs/" + encodeURIComponent(d.row.id) + "/cancel", {
            method: "POST", credentials: "same-origin",
            headers: { "X-Spotwise-Token": body.dataset.token },
          });
          const answer = await r.json();
          cancelNote = r.ok ? "cancel requested: " + answer.state : "refused: " + answer.error;
        } catch (err) {
          cancelNote = "refused: the dashboard did not answer (" + err + "); try again";
        }
        render();
      } });
    button.disabled = cancelNote !== null && !cancelNote.startsWith("refused");
    return button;
  }

  function goodputTable(ledger) {
    const rows = Object.keys(KIND_COLOURS).map((k) => el("tr", { "data-kind": k },
      el("td", {}, el("span", { class: "swatch", style: null, "data-colour": k }), k),
      cell("seconds", dur(ledger.seconds[k]), ledger.seconds[k]),
      cell("share", ledger.wall_s > 0 ? (100 * ledger.seconds[k] / ledger.wall_s).toFixed(1) + "%" : "-"),
      cell("usd", usd(ledger.usd[k]), ledger.usd[k])));
    rows.push(el("tr", { class: "total" }, el("td", { text: "total" }),
      cell("seconds", dur(ledger.wall_s), ledger.wall_s), cell("share", "100%"),
      cell("usd", usd(ledger.cost_usd), ledger.cost_usd)));
    const t = el("table", { id: "goodput" }, el("thead", {}, el("tr", {},
      el("th", { text: "where the time went" }), el("th", { text: "wall time" }),
      el("th", { text: "share" }), el("th", { text: "cost" }))), el("tbody", {}, ...rows));
    for (const sw of t.querySelectorAll(".swatch")) sw.style.background = KIND_COLOURS[sw.dataset.colour];
    return t;
  }

  function timeline(d, width) {
    const zones = [];
    for (const a of d.attempts) if (!zones.includes(a.zone)) zones.push(a.zone);
    const rowH = 34, left = 110, right = 10, top = 6, axisH = 22;
    const height = top + zones.length * rowH + axisH;
    const span = Math.max(d.now, ...d.attempts.map((a) => a.end || d.now), 1);
    const x = (t) => left + (width - left - right) * Math.max(0, t) / span;
    const root = svg("svg", { id: "timeline", width: width, height: height,
                              viewBox: `0 0 ${width} ${height}`, role: "img" });
    zones.forEach((z, i) => {
      // a long zone name would run under the bars: cut to the label's width, whole on hover
      const label = svg("text", { x: 4, y: top + i * rowH + 20, class: "zone" },
                        z.length > 16 ? z.slice(0, 15) + "…" : z);
      label.append(svg("title", {}, z));
      root.append(label);
      root.append(svg("line", { x1: left, x2: width - right, y1: top + (i + 1) * rowH - 2,
                                y2: top + (i + 1) * rowH - 2, class: "grid" }));
    });
    const rowOf = (a) => top + zones.indexOf(a.zone) * rowH;
    const byN = {};
    for (const a of d.attempts) {
      byN[a.n] = a;
      const y = rowOf(a), end = a.end === null ? d.now : a.end;
      const bar = svg("rect", { x: x(a.start), y: y + 4, width: Math.max(1, x(end) - x(a.start)),
        height: 14, fill: MARKET_COLOURS[a.market] || "#64748b", class: "attempt",
        "data-n": a.n, "data-market": a.market });
      bar.append(svg("title", {}, `attempt ${a.n}: ${a.market} ${a.zone}, ${dur(end - a.start)}` +
        (a.reason ? `, ${a.reason}` : ", running")));
      root.append(bar);
      if (a.reason === "preempted" || a.reason === "lost") {
        const px = x(end);
        root.append(svg("path", { d: `M${px - 5},${y + 1} L${px + 5},${y + 11} M${px + 5},${y + 1} L${px - 5},${y + 11}`,
          class: "preemption", "data-n": a.n }, null));
      }
    }
    for (const [t0, t1, kind, n] of d.segments) {
      if (n === null || !byN[n]) continue;
      root.append(svg("rect", { x: x(t0), y: rowOf(byN[n]) + 20, height: 6,
        width: Math.max(0.5, x(t1) - x(t0)), fill: KIND_COLOURS[kind], class: "segment" }));
    }
    const owner = (t) => d.attempts.find((a) => a.start <= t && t <= (a.end === null ? d.now : a.end));
    for (const c of d.checkpoints) {
      const a = owner(c.t);
      if (a) root.append(svg("line", { x1: x(c.t), x2: x(c.t), y1: rowOf(a) + 2, y2: rowOf(a) + 4,
                                       class: "save" }));
    }
    for (const nt of d.notices) {
      const a = owner(nt.t);
      if (!a) continue;
      const px = x(nt.t), y = rowOf(a);
      const mark = svg("path", { d: `M${px - 4},${y} L${px + 4},${y} L${px},${y + 6} Z`, class: "notice" });
      mark.append(svg("title", {}, `notice from ${nt.source} at ${dur(nt.t)}`));
      root.append(mark);
    }
    const ay = top + zones.length * rowH + 14;
    for (let i = 0; i <= 4; i++) {
      const t = span * i / 4;
      root.append(svg("text", { x: x(t), y: ay, class: "axis", "text-anchor": i === 0 ? "start" : (i === 4 ? "end" : "middle") }, dur(t)));
    }
    return root;
  }

  function chart(id, title, width, xs, series, opts, note) {
    const box = el("div", { class: "chart", id: id }, el("h3", { text: title }), note);
    if (!xs.length || !window.uPlot) {
      box.append(el("p", { class: "muted", text: "no data yet" }));
      return box;
    }
    const palette = ["#2563eb", "#ea580c", "#16a34a", "#7c3aed", "#db2777", "#0891b2"];
    const conf = {
      width: width, height: 180, legend: { show: true, live: false },
      scales: { x: { time: false } },
      axes: [{ values: (u, ticks) => ticks.map((t) => dur(t)) }, { size: 60 }],
      series: [{ label: "time" }].concat(series.map((s, i) => Object.assign(
        { stroke: palette[i % palette.length], width: 2, spanGaps: true, points: { show: false } },
        s.opts, { label: s.label }))),
    };
    // beyond ~1e15 (a diverging loss) uPlot's default tick steps run out and its padded range
    // overflows near 1e308: the y axis then gets steps up to 5e307, no padding, e-notation
    const largest = series.reduce((m, s) => s.values.reduce((a, v) => (known(v) ? Math.max(a, Math.abs(v)) : a), m), 0);
    if (largest >= HUGE) {
      conf.scales.y = { range: (u, min, max) => (min === max ? [min - 1, max + 1] : [min, max]) };
      conf.axes[1] = { size: 72, incrs: HUGE_STEPS,
        values: (u, ticks) => ticks.map((t) => (Math.abs(t) >= 1e6 ? t.toExponential(0) : String(t))) };
    }
    Object.assign(conf, opts || {});
    charts.push({ box: box, make: () => new uPlot(conf, [xs].concat(series.map((s) => s.values)), box) });
    return box;
  }

  function cumulative(d) {
    const byN = Object.fromEntries(d.attempts.map((a) => [a.n, a]));
    const xs = [0], useful = [0], cost = [0], ondemand = [0];
    let u = 0, c = 0, o = 0;
    for (const [t0, t1, kind, n] of d.segments) {
      const a = n === null ? null : byN[n];
      if (kind === "useful") u += t1 - t0;
      if (a) {
        const hours = (t1 - t0) * a.time_scale / 3600;
        c += hours * a.usd_per_hour;
        o += hours * a.ondemand_usd_per_hour;
      }
      xs.push(t1); useful.push(u); cost.push(c); ondemand.push(o);
    }
    return { xs, useful, cost, ondemand };
  }

  function renderJob(d) {
    for (const c of charts) if (c.plot) c.plot.destroy();
    charts = [];
    const width = Math.max(320, Math.min(main.clientWidth || 900, 1100));
    const half = Math.max(280, Math.floor((width - 16) / 2) - 18);
    const r = d.row, L = d.ledger;
    const slack = d.deadline_s !== null && d.expected_runtime_s !== null && !r.terminal
      ? d.deadline_s - d.now - Math.max(0, d.expected_runtime_s - L.seconds.useful) : null;
    const cum = cumulative(d);
    const progressSeries = [{ label: "useful compute (s)", values: cum.useful }];
    if (d.deadline_s !== null && d.expected_runtime_s !== null) {
      progressSeries.push({ label: "on schedule for the deadline", opts: { dash: [6, 4], width: 1 },
        values: cum.xs.map((t) => Math.min(d.expected_runtime_s, d.expected_runtime_s * t / d.deadline_s)) });
    }
    const m = d.metrics;
    // a value logged as NaN or Infinity arrives as null: a gap in the line, not a bridge
    const lossSeries = Object.keys(m.values).map((k) => ({ label: k, values: m.values[k],
                                                           opts: { spanGaps: false } }));
    const diverged = Object.entries(m.nonfinite || {}).map(([k, v]) =>
      `${k} became ${v.value} at step ${v.step} (${dur(v.t)}); drawn as a gap`);
    const g = d.gpu;
    const gpuSeries = Object.keys(g.util_pct).map((k) => ({ label: "GPU " + k + " util %", values: g.util_pct[k] }));
    const ckpts = d.checkpoints.slice(-10).reverse().map((c) => el("tr", {},
      cell("t", dur(c.t)), cell("step", String(c.step)), cell("reason", c.reason || "-"),
      cell("bytes", c.bytes === null || c.bytes === undefined ? "-" : (c.bytes / 1024).toFixed(1) + " KiB"),
      cell("stall", c.stall_s === null || c.stall_s === undefined ? "-" : (1000 * c.stall_s).toFixed(1) + " ms")));
    const events = d.events.slice(-30).reverse().map((e) => el("li", { "data-kind": e.kind },
      el("span", { class: "t", text: dur(e.t) }), " ", el("b", { text: e.kind }), " ", e.message));

    main.replaceChildren(
      el("h1", {}, "Job ", el("span", { id: "job-id", text: r.id }), " ", stateBadge(r.state)),
      el("p", { class: "message", text: r.message }),
      el("div", { class: "stats" },
        stat("attempts", String(r.attempts), "stat-attempts"),
        stat("preemptions", String(r.preemptions), "stat-preemptions"),
        stat("cost", usd(r.cost_usd), "stat-cost"),
        stat("on-demand, same hours", usd(r.ondemand_cost_usd), "stat-ondemand"),
        stat("saved", usd(r.savings_usd), "stat-savings"),
        stat("goodput", pct(L.goodput), "stat-goodput"),
        stat("deadline", r.deadline_at ? when(r.deadline_at) : "-", "stat-deadline"),
        stat("slack", slack === null ? "-" : dur(slack), "stat-slack")),
      el("div", { class: "actions" }, cancelButton(d), el("span", { id: "cancel-result", text: cancelNote })),
      el("h2", { text: "Attempts" }),
      el("div", { class: "legend" }, el("span", { class: "spot", text: "spot" }), " ",
         el("span", { class: "ondemand", text: "on-demand" }), " · ✕ preemption · ▼ notice · | checkpoint"),
      timeline(d, width),
      el("div", { class: "grid2" },
        el("div", {}, el("h2", { text: "Goodput" }), goodputTable(L),
          el("p", { class: "muted", text: `An on-demand-only run of the same useful compute: ${usd(L.ondemand_run_usd)}; saved ${usd(L.savings_usd)}.` }),
          el("p", { id: "rightsizing" }, el("b", { text: "Rightsizing: " }), d.rightsizing.line)),
        el("div", {}, el("h2", { text: "Checkpoints" }), el("table", { id: "checkpoints" },
          el("thead", {}, el("tr", {}, ...["at", "step", "why", "size", "stall"].map((h) => el("th", { text: h })))),
          el("tbody", {}, ...ckpts)))),
      el("div", { class: "charts" },
        chart("chart-progress", "Progress vs. deadline", half, cum.xs, progressSeries),
        chart("chart-cost", "Cumulative cost vs. on-demand ($)", half, cum.xs,
          [{ label: "cost", values: cum.cost }, { label: "on-demand, same hours", values: cum.ondemand }]),
        chart("chart-loss", "Training metrics (run.log)", half, m.t, lossSeries, null,
              diverged.length ? el("p", { class: "warning", id: "nonfinite",
                                          text: diverged.join("; ") }) : null),
        chart("chart-gpu", "GPU utilisation (%)", half, g.t, gpuSeries)),
      el("div", { class: "grid2" },
        el("div", {}, el("h2", { text: "Events" }), el("ul", { id: "events" }, ...events)),
        el("div", {}, el("h2", { text: "Log" }), el("pre", { id: "log", text: d.log_tail.join("\n") }))));
    for (const c of charts) c.plot = c.make();
  }

  function render() {
    if (body.dataset.page === "jobs") renderJobs(data);
    else renderJob(data);
    body.dataset.rendered = String(Number(body.dataset.rendered || 0) + 1);
  }

  render();
  if (live) {
    const job = body.dataset.page === "job" ? data.row.id : null;
    const source = new EventSource(job ? "/api/stream?job=" + encodeURIComponent(job) : "/api/stream");
    source.addEventListener("update", (e) => { data = JSON.parse(e.data); render(); });
  }
})();
