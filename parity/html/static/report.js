// The parity report's page logic: the case table (sort, filter, paginate) and the detail
// view of one case (its data from <assets>/cases/<n>.js, plots by plotly, loaded on demand).
// Every string from the results reaches the page through textContent or an attribute set
// with setAttribute; never through innerHTML. Strings given to plotly are entity-escaped.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const ASSETS = data.assets;
  const VERDICTS = data.verdict_order;
  const rows = data.rows;
  const candidates = data.backends.filter(b => data.sides[b] === "candidate");

  // ------------------------------------------------------------------ helpers
  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) e.setAttribute(k, String(v));
    }
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function add(parent, tag, attrs, text) { const e = el(tag, attrs, text); parent.appendChild(e); return e; }
  function vclass(v) { return VERDICTS.includes(v) ? "v-" + v : "v-other"; }
  // a verdict as the terminal and the gate print it (unsupported: the backend has no kernel for the case)
  function chip(v) { return el("span", { class: "chip " + vclass(v) }, v); }
  function fmt(x) {
    if (x === null || x === undefined) return "–";
    if (typeof x !== "number") return String(x);
    if (x === 0) return "0";
    const a = Math.abs(x);
    return (a >= 1e-3 && a < 1e4) ? String(Number(x.toPrecision(3))) : x.toExponential(2);
  }
  function plotText(s) {  // plotly reads a little HTML in text: give it entities, not tags
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  function rank(v) { const i = VERDICTS.indexOf(v); return i < 0 ? -1 : i; }
  function caseHref(id) { return "#case=" + encodeURIComponent(id); }  // a case's link: its id, percent-encoded

  // ------------------------------------------------------------------ table columns
  const columns = [
    { key: "id", label: "case", group: "", get: r => r.id, cell: r => {
        const td = el("td", { class: "id" });
        add(td, "a", { href: caseHref(r.id), class: "case-link" }, r.id);
        if (r.refused) td.setAttribute("title", "gate refused: " + r.refused);
        return td; } },
    { key: "verdict", label: "verdict", group: "", get: r => rank(r.verdict), cell: r => { const td = el("td"); td.appendChild(chip(r.verdict)); return td; } },
    { key: "op", label: "op", group: "", get: r => r.op },
    { key: "dtype", label: "dtype", group: "", get: r => r.dtype },
    { key: "C", label: "C", group: "", get: r => r.C, title: "chunk size" },
    { key: "gating", label: "gating", group: "", get: r => r.gating },
  ];
  if (data.compile_targets && data.compile_targets.length) {  // TPU compile records: worst over candidates
    columns.push({ key: "compile", label: "TPU compile", group: "",
      title: "compiled for TPU on a CPU host (deviceless AOT compile; nothing executed) for " + data.compile_targets.join(", ") +
             ": the worst over candidates and targets, and the failing (candidate: target) pairs",
      get: r => r.cc ? rank(r.cc.v) : undefined,
      cell: r => { const td = el("td", { class: "compile" }); const c = r.cc;
        if (c) {
          td.appendChild(chip(c.v === "pass" ? "pass" : c.v));
          td.appendChild(document.createTextNode(c.f ? " " + c.f : ` ${c.ok}/${c.n}`));
          if (c.err) td.setAttribute("title", c.err);
        }
        return td; } });
  }
  function metric(c, k) {  // no value: undefined (sorts last); NaN/Inf: +Infinity (worst)
    if (!c) return undefined;
    if (c.nan) return Infinity;
    return c[k] === undefined ? undefined : c[k];
  }
  // candidates first, then the reference and the oracle: at 1280 px a candidate's verdict and where
  // it fails are in view without scrolling the table sideways
  const SIDE_ORDER = { candidate: 0, reference: 1, oracle: 2 };
  const tableBackends = [...data.backends].sort((a, b2) => (SIDE_ORDER[data.sides[a]] ?? 3) - (SIDE_ORDER[data.sides[b2]] ?? 3));
  for (const b of tableBackends) {
    const side = data.sides[b];
    // a candidate's verdict is the gate's (tolerance and bound) where the gate judged it; else the record's own
    const gated = rows.some(r => r.b[b] && r.b[b].g);
    columns.push({ key: b + ".v", label: side === "oracle" ? "status" : (gated ? "verdict" : "verdict (tolerance only)"), group: b,
      title: gated ? "the gate's verdict (tolerance and bound), and the tensor and rule that decided it" : "each tensor against its tolerance alone (no bound)",
      get: r => r.b[b] ? rank(r.b[b].v) : undefined,
      cell: r => { const td = el("td", { class: "bstart" }); const c = r.b[b];
        if (c) {
          td.appendChild(chip(c.v));
          if (c.d) add(td, "span", { class: "decided" }, " " + c.d);
          const title = [c.w, c.err, gated && !c.g ? "tolerance only: the gate did not judge this case" : null].filter(Boolean).join("\n");
          if (title) td.setAttribute("title", title);
        }
        return td; } });
    if (side === "oracle") continue;
    if (side === "candidate") {
      columns.push({ key: b + ".l", label: "where", group: b,
        title: "localisation of the failure: pattern, first chunk (token) and head over the tolerance or bound",
        get: r => r.b[b] ? r.b[b].l : undefined, text: r => r.b[b] && r.b[b].l });
    }
    columns.push({ key: b + ".t", label: "worst", group: b, title: "the tensor furthest above its tolerance (NaN/Inf first)",
      get: r => r.b[b] ? r.b[b].t : undefined, text: r => r.b[b] && r.b[b].t });
    columns.push({ key: b + ".e", label: "rel_rms", group: b, num: true, title: "rel_rms of the worst tensor against the float64 oracle",
      get: r => metric(r.b[b], "e"), text: r => r.b[b] && (r.b[b].nan ? "NaN/Inf" : fmt(r.b[b].e)) });
    columns.push({ key: b + ".m", label: "max_abs", group: b, num: true, title: "max |x - oracle| of the worst tensor",
      get: r => metric(r.b[b], "m"), text: r => r.b[b] && (r.b[b].nan ? "NaN/Inf" : fmt(r.b[b].m)) });
    if (side === "candidate") {
      columns.push({ key: b + ".r", label: "bound", group: b, num: true,
        title: "max over tensors of eps_candidate / (factor x eps_reference + floor), rel_rms and max_abs; above 1 fails the bound",
        get: r => r.b[b] ? r.b[b].r : undefined,
        text: r => r.b[b] && fmt(r.b[b].r), warn: r => r.b[b] && r.b[b].r > 1 });
    }
  }

  // ------------------------------------------------------------------ table state
  const state = { sort: [{ key: "verdict", dir: 1 }, { key: "id", dir: 1 }], page: 0, size: 100,
                  filters: { text: "", verdict: "", op: "", dtype: "", C: "", gating: "" } };
  const table = document.getElementById("case-table");
  const tbody = table.querySelector("tbody");

  const hiddenBackends = new Set();
  let shown = columns;
  function buildHeader() {
    shown = columns.filter(c => !hiddenBackends.has(c.group));
    const thead = table.querySelector("thead");
    thead.replaceChildren();
    const groups = add(thead, "tr", { class: "groups" });
    let i = 0;
    while (i < shown.length) {
      let j = i;
      while (j < shown.length && shown[j].group === shown[i].group) j++;
      add(groups, "th", { colspan: j - i, class: shown[i].group ? "bgroup" : "" }, shown[i].group);
      i = j;
    }
    const tr = add(thead, "tr", { id: "sort-row" });
    for (const c of shown) {
      const th = add(tr, "th", { "data-key": c.key, title: c.title || "sort by " + c.label, class: c.group && c.label.match(/verdict|status/) ? "bstart" : "" });
      add(th, "button", { type: "button", class: "sort" }, c.label);
      th.addEventListener("click", () => {
        const first = state.sort[0];
        const dir = first.key === c.key ? -first.dir : (c.num ? -1 : 1);
        state.sort = [{ key: c.key, dir: dir }, { key: "verdict", dir: 1 }, { key: "id", dir: 1 }];
        state.page = 0;
        render();
      });
    }
  }

  function compare(a, b, col, dir) {
    const x = col.get(a), y = col.get(b);
    if (x === undefined || y === undefined) return x === y ? 0 : (x === undefined ? 1 : -1);  // missing: last
    if (x === y) return 0;
    return (x < y ? -1 : 1) * dir;
  }
  const byKey = Object.fromEntries(columns.map(c => [c.key, c]));

  function visibleRows() {
    const f = state.filters;
    const text = f.text.trim().toLowerCase();
    const out = rows.filter(r =>
      (!text || r.id.toLowerCase().includes(text)) &&
      (!f.verdict || (f.verdict === "!pass" ? r.verdict !== "pass" : r.verdict === f.verdict)) &&
      (!f.op || String(r.op) === f.op) && (!f.dtype || String(r.dtype) === f.dtype) &&
      (!f.C || String(r.C) === f.C) && (!f.gating || r.gating === f.gating));
    out.sort((a, b) => {
      for (const s of state.sort) {
        const d = compare(a, b, byKey[s.key], s.dir);
        if (d) return d;
      }
      return 0;
    });
    return out;
  }

  function render() {
    const list = visibleRows();
    const pages = Math.max(1, Math.ceil(list.length / state.size));
    state.page = Math.min(state.page, pages - 1);
    const start = state.page * state.size;
    const frag = document.createDocumentFragment();
    for (const r of list.slice(start, start + state.size)) {
      const tr = el("tr", { class: "row " + vclass(r.verdict), "data-n": r.n });
      for (const c of shown) {
        let td;
        if (c.cell) td = c.cell(r);
        else {
          td = el("td", { class: c.num ? "num" : "" }, c.text ? c.text(r) : c.get(r));
          if (c.warn && c.warn(r)) td.classList.add("over");
        }
        td.dataset.key = c.key;  // the column's key, as its header's data-key
        tr.appendChild(td);
      }
      frag.appendChild(tr);
    }
    tbody.replaceChildren(frag);
    for (const th of table.querySelectorAll("#sort-row th")) {
      const s = state.sort[0];
      th.setAttribute("aria-sort", th.dataset.key === s.key ? (s.dir > 0 ? "ascending" : "descending") : "none");
    }
    document.getElementById("count").textContent =
      `${list.length} of ${rows.length} cases` + (list.length ? `; showing ${start + 1}–${Math.min(start + state.size, list.length)}` : "");
    document.getElementById("page").textContent = `page ${state.page + 1} of ${pages}`;
    document.getElementById("prev").disabled = state.page === 0;
    document.getElementById("next").disabled = state.page >= pages - 1;
  }

  function setupFilters() {
    const options = (key) => [...new Set(rows.map(r => String(r[key])))].sort((a, b) =>
      (isFinite(a) && isFinite(b)) ? Number(a) - Number(b) : a.localeCompare(b));
    const verdicts = [...new Set(rows.map(r => r.verdict))].sort((a, b) => rank(a) - rank(b));
    for (const v of verdicts) add(document.getElementById("f-verdict"), "option", { value: v }, v);
    for (const key of ["op", "dtype", "C", "gating"]) {
      const sel = document.getElementById("f-" + key);
      for (const v of options(key)) add(sel, "option", { value: v }, v);
    }
    for (const key of ["verdict", "op", "dtype", "C", "gating"]) {
      document.getElementById("f-" + key).addEventListener("change", e => { state.filters[key] = e.target.value; state.page = 0; render(); });
    }
    const box = document.getElementById("f-backends");
    for (const b of data.backends) {
      const label = add(box, "label", { class: "backend-toggle" });
      const cb = add(label, "input", { type: "checkbox", "data-backend": b });
      cb.checked = true;
      label.appendChild(document.createTextNode(" " + b));
      cb.addEventListener("change", () => {
        if (cb.checked) hiddenBackends.delete(b); else hiddenBackends.add(b);
        buildHeader();
        render();
      });
    }
    document.getElementById("f-text").addEventListener("input", e => { state.filters.text = e.target.value; state.page = 0; render(); });
    document.getElementById("f-size").addEventListener("change", e => { state.size = Number(e.target.value); state.page = 0; render(); });
    document.getElementById("filters").addEventListener("submit", e => e.preventDefault());
    document.getElementById("prev").addEventListener("click", () => { state.page--; render(); });
    document.getElementById("next").addEventListener("click", () => { state.page++; render(); });
  }

  // ------------------------------------------------------------------ lazy loading
  const loadedCases = {};
  const waiting = {};
  window.parityCaseLoaded = function (n, d) {
    loadedCases[n] = d;
    if (waiting[n]) { waiting[n].resolve(d); delete waiting[n]; }
  };
  function loadScript(src) {
    return new Promise((resolve, reject) => {
      const s = el("script", { src: src });
      s.onload = () => resolve();
      s.onerror = () => reject(new Error("could not load " + src));
      document.head.appendChild(s);
    });
  }
  function loadCase(n) {
    if (loadedCases[n]) return Promise.resolve(loadedCases[n]);
    return new Promise((resolve, reject) => {
      waiting[n] = { resolve: resolve };
      loadScript(`${ASSETS}/cases/${n}.js`).catch(reject);
    });
  }
  let plotlyPromise = null;
  function loadPlotly() {
    if (window.Plotly) return Promise.resolve(window.Plotly);
    plotlyPromise = plotlyPromise || loadScript(`${ASSETS}/plotly.min.js`).then(() => window.Plotly);
    return plotlyPromise;
  }

  // ------------------------------------------------------------------ detail view
  const summarySection = document.getElementById("summary");
  const casesSection = document.getElementById("cases");
  const detail = document.getElementById("detail");
  const body = document.getElementById("detail-body");

  function kvTable(parent, pairs, cls) {
    const t = add(parent, "table", { class: "kv " + (cls || "") });
    for (const [k, v] of pairs) {
      const tr = add(t, "tr");
      add(tr, "th", {}, k);
      add(tr, "td", {}, v);
    }
    return t;
  }
  function gridTable(parent, header, rowsData, cls) {  // in a .table-wrap: scrolls sideways when wider than the page
    const t = add(add(parent, "div", { class: "table-wrap" }), "table", { class: "grid " + (cls || "") });
    const hr = add(add(t, "thead"), "tr");
    for (const h of header) add(hr, "th", {}, h);
    const tb = add(t, "tbody");
    for (const r of rowsData) {
      const tr = add(tb, "tr");
      for (const v of r) {
        if (v instanceof Node) add(tr, "td").appendChild(v);
        else add(tr, "td", {}, v);
      }
    }
    return t;
  }

  function renderHeader(d) {
    const h = add(body, "h2", { id: "detail-title" });
    h.appendChild(chip(d.verdict));
    h.appendChild(document.createTextNode(" " + d.id));
    if (d.refused) add(body, "p", { class: "refusal" }, "gate refused this case: " + d.refused);
    const c = d.case || {};
    const hashes = [...new Set(d.backends.map(b => b.input_hash))];
    const versions = [...new Set(d.backends.map(b => `oracle v${b.oracle_version}, tol v${b.tol_version}`))];
    kvTable(body, [
      ["op", c.op], ["shape", `B=${c.B} T=${c.T} H=${c.H} K=${c.K} V=${c.V}`], ["dtype", c.dtype],
      ["chunk size", c.chunk_size], ["gating", c.gate + (c.gate_params && Object.keys(c.gate_params).length ? " " + JSON.stringify(c.gate_params) : "")],
      ["scale", c.scale === null ? "K^-0.5" : c.scale], ["h0 / ht", `${c.h0} / ${c.ht}`],
      ["seqlens", c.seqlens ? c.seqlens.join(", ") : "–"], ["seed", c.seed], ["direction", c.direction],
    ].concat(d.backends.length ? [["input hash", hashes.join(" ≠ ")], ["oracle / tolerance", versions.join(" ≠ ")]] : []),
    "case-fields");
    if (hashes.length > 1) add(body, "p", { class: "warn" }, "backends saw different inputs (input hashes differ): not comparable");
  }

  function renderBackends(d) {
    add(body, "h3", {}, "Backends");
    if (!d.backends.length) { add(body, "p", { class: "note" }, "no result records for this case (TPU compile records only)"); return; }
    const verdictCell = b => {  // the gate's verdict for a judged candidate; the record's own (tolerance only) otherwise
      const span = el("span");
      span.appendChild(chip(b.row_verdict));
      if (!(b.side === "candidate" && b.gate && b.gate.verdict)) span.appendChild(document.createTextNode(" tolerance only"));
      return span;
    };
    const rowsData = d.backends.map(b => [
      b.name, b.side, verdictCell(b), b.platform || "–", b.implementation || "–",
      Object.entries(b.versions || {}).map(([k, v]) => `${k} ${v}`).join(", ") || "–",
      fmt(b.kernel_time_s), fmt(b.wall_time_s), b.created, b.host, b.run_id]);
    gridTable(body, ["backend", "side", "verdict", "platform", "implementation", "versions", "kernel s", "wall s", "created", "host", "run"], rowsData, "backends");
    add(body, "h3", {}, "Repro");
    for (const b of d.backends.filter(b => b.side !== "oracle")) {
      const div = add(body, "div", { class: "repro" });
      add(div, "span", { class: "label" }, b.name);
      add(div, "code", {}, b.repro);
    }
    for (const b of d.backends.filter(b => b.error)) {
      const det = add(body, "details", { class: "error", open: "" });
      add(det, "summary", {}, `${b.name}: ${b.status}`);
      add(det, "pre", {}, b.error);
    }
    for (const b of d.backends.filter(b => b.notes && Object.keys(b.notes).length)) {
      add(body, "p", { class: "note" }, `${b.name} notes: ${JSON.stringify(b.notes)}`);
    }
  }

  function renderStages(d) {  // an op case whose stage cases ran: each candidate's stages in order, the first that fails
    if (d.stages_error) add(body, "p", { class: "note" }, d.stages_error);
    for (const loc of d.stages || []) {
      add(body, "h3", { class: "stages" }, `Stages of ${loc.candidate} (${loc.stage_candidate})`);
      const link = s => { const a = el("a", { href: "#case=" + encodeURIComponent(s.case_id) }, s.stage); return a; };
      const verdict = s => { const span = el("span"); span.appendChild(chip(s.verdict)); return span; };
      gridTable(body, ["stage", "verdict", "decided by", "where", ""], loc.stages.map(s => [
        link(s), verdict(s), s.why || s.detail || "–", s.where || "–", s.stage === loc.first ? "the first that fails" : ""]), "stages");
      for (const n of loc.not_judged || []) add(body, "p", { class: "note" }, `not judged: ${n.stage}: ${n.verdict}${n.why ? ": " + n.why : ""}`);
      if (loc.first) {
        const first = loc.stages.find(s => s.stage === loc.first);
        const div = add(body, "div", { class: "repro" });
        add(div, "span", { class: "label" }, `${loc.first} alone`);
        add(div, "code", {}, first.repro);
      } else if (!loc.given.length) {
        add(body, "p", { class: "note" }, `${loc.stage_candidate} gives none of this op's stages`);
      }
    }
  }

  function fmtBytes(n) {
    if (typeof n !== "number") return "–";
    return n < 1024 ? `${n} B` : (n < 1048576 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1048576).toFixed(2)} MiB`);
  }
  function classes(m) {  // {"f32x6": 48} -> "f32x6 48"
    const e = Object.entries(m || {});
    return e.length ? e.map(([k, v]) => `${k} ${v}`).join(", ") : "–";
  }
  function errorPre(parent, text, op) {  // the full error as text, the MLIR operation in a <mark>
    const pre = add(parent, "pre", { class: "compile-error" });
    const i = op ? text.indexOf(op) : -1;
    if (i < 0) {
      pre.textContent = text;
      if (op) { const p = add(parent, "p", {}, "MLIR operation: "); add(p, "mark", { class: "mlir-op" }, op); }
      return pre;
    }
    pre.appendChild(document.createTextNode(text.slice(0, i)));
    add(pre, "mark", { class: "mlir-op" }, op);
    pre.appendChild(document.createTextNode(text.slice(i + op.length)));
    return pre;
  }
  function renderCompile(d) {
    if (!d.compile || !d.compile.length) return;
    add(body, "h3", { id: "compile-detail" }, "TPU compile");
    add(body, "p", { class: "note" }, d.compile_label);
    for (const c of d.compile) {
      const sec = add(body, "section", { class: "compile", "data-backend": c.backend });
      const h = add(sec, "h4");
      h.appendChild(chip(c.verdict));
      h.appendChild(document.createTextNode(` ${c.backend} (${c.program || "?"})`));
      kvTable(sec, [["implementation", c.implementation || "–"], ["libtpu / jax", `${c.libtpu || "?"} / ${c.jax || "?"}`],
                    ["numerics model", c.numerics || "–"], ["host", c.host || "–"], ["created", c.created || "–"], ["run", c.run_id || "–"]]);
      const rp = add(sec, "div", { class: "repro" });
      add(rp, "span", { class: "label" }, "repro");
      add(rp, "code", {}, c.repro);
      gridTable(sec, ["target", "topology", "device kind", "result", "seconds", "kernels", "arguments", "outputs", "temp", "code"],
        c.targets.map(t => {
          const m = t.memory || {};
          const res = el("span", { class: t.ok ? "cc-ok" : "fail" }, t.ok ? "ok" : "error");
          return [t.target, t.topology || "–", t.device_kind || "–", res, fmt(t.seconds), t.ok ? (t.kernels || []).length : "–",
                  fmtBytes(m.argument_size_in_bytes), fmtBytes(m.output_size_in_bytes), fmtBytes(m.temp_size_in_bytes),
                  fmtBytes(m.generated_code_size_in_bytes)];
        }), "compile-targets");
      for (const t of c.targets) {
        const div = add(sec, "div", { class: "compile-target", "data-target": t.target });
        if (!t.ok) {
          add(div, "p", { class: "fail" }, `${t.target}: ${t.error_line || (String(t.error || "").split("\n").find(l => l.trim()) || "failed")}`);
          errorPre(div, String(t.error || ""), t.error_op || "");
          continue;
        }
        const num = t.numerics || {};
        const nk = num.kernels || {};
        const mosaic = t.mosaic || {};
        const names = [...new Set([...(t.kernels || []), ...Object.keys(mosaic), ...Object.keys(nk)])];
        add(div, "p", {}, `${t.target}: compiled in ${fmt(t.seconds)} s, ${names.length} Mosaic kernel(s)`);
        if (names.length) gridTable(div, ["kernel", "VMEM", "weight loads", "MXU matmuls (compiled)", "numerics model", "agree"],
          names.map(k => {
            const mk = mosaic[k] || {}, n = nk[k];
            const agree = n ? el("span", { class: n.agree ? "cc-ok" : "fail" }, n.agree ? "yes" : "NO") : "–";
            return [k, mk.vmem_bytes === undefined ? "–" : `${fmtBytes(mk.vmem_bytes)} (${mk.vmem_bytes} B)`,
                    mk.weight_loads === undefined ? "–" : mk.weight_loads, classes(mk.matmuls), n ? classes(n.model) : "–", agree];
          }), "compile-kernels");
        if (num.error) add(div, "p", { class: "warn" }, "numerics check not made: " + num.error);
        for (const mm of num.mismatches || []) add(div, "p", { class: "fail mismatch" }, "numerics mismatch: " + mm);
        if (t.error) {  // ok with a note (e.g. no Mosaic kernel) is still shown
          add(div, "p", { class: "warn" }, t.error);
        }
      }
    }
  }

  function boundText(g) {
    if (!g) return "–";
    if (!g.bound) return g.bound_note || "–";
    const r = g.bound.rel_rms || {}, m = g.bound.max_abs || {};
    return `rel_rms ${fmt(r.candidate)} ≤ ${fmt(r.limit)}? max_abs ${fmt(m.candidate)} ≤ ${fmt(m.limit)}? → bound ${g.bound.verdict} (eps ratio ${fmt(r.ratio)})`;
  }

  const plots = [];
  function renderTensor(d, name) {
    const sec = add(body, "section", { class: "tensor", "data-tensor": name });
    add(sec, "h3", {}, name);
    const compared = d.backends.filter(b => b.side !== "oracle" && b.tensors[name]);
    const oracle = d.backends.find(b => b.side === "oracle" && b.tensors[name]);
    if (oracle) {
      const o = oracle.tensors[name];
      add(sec, "p", { class: "note" }, `oracle: shape [${(o.shape || []).join(", ")}], rms ${fmt(o.rms)}, max |x| ${fmt(o.max_abs)}` +
        (o.nonfinite ? `, ${o.nonfinite} non-finite` : ""));
    }
    const metricsRows = compared.map(b => {
      const t = b.tensors[name];
      const g = b.gate && b.gate.tensors ? b.gate.tensors[name] : null;
      const v = g ? g.verdict : t.verdict;
      if (t.verdict === "unsupported") return [b.name, chip(v), t.reason || "", "", "", "", "", "", "", "", "", ""];
      // the rule that decided the verdict (the gate's entry), or the record's own check against its tolerance
      const why = g && g.why ? g.why : (b.side === "candidate" ? "tolerance only (no gate)" : "tolerance only (reference)");
      const nonfinite = t.nan || t.inf ? " (finite only)" : "";
      return [b.name, chip(v), fmt(t.rel_rms) + nonfinite, fmt(t.tol), fmt(t.floor_rel), fmt(t.max_abs), fmt(t.max_abs_over_rms),
              fmt(t.max_ulp), `${t.nan || 0} / ${t.inf || 0}`, b.side === "candidate" ? boundText(g) : "reference", why,
              (g && g.where) || t.where || "–"];
    });
    gridTable(sec, ["backend", "verdict", "rel_rms", "tol", "dtype floor", "max_abs", "max_abs/rms", "max ulp", "NaN / Inf", "bound", "decided by", "localisation"], metricsRows, "metrics");
    const withData = compared.filter(b => b.tensors[name].profile);
    for (const b of withData) {
      const t = b.tensors[name];
      if (t.nan || t.inf) add(sec, "p", { class: "warn" }, `${b.name}: ${t.nan || 0} NaN and ${t.inf || 0} Inf where the oracle is finite; the curves show the finite elements only`);
    }
    if (withData.length) {
      const row = add(sec, "div", { class: "plots" });
      const prof = add(row, "div", { class: "plot profile", "data-kind": "profile" });
      const hasHeat = withData.some(b => b.tensors[name].heatmap);
      const heat = hasHeat ? add(row, "div", { class: "plot heatmap", "data-kind": "heatmap" }) : null;
      plots.push(() => drawProfile(prof, d, name, withData));
      if (heat) plots.push(() => drawHeatmap(heat, d, name, withData.filter(b => b.tensors[name].heatmap)));
    }
    const worstRows = [];
    for (const b of compared) {
      for (const w of b.tensors[name].worst || []) {
        const diff = (w.value === null || w.oracle === null) ? null : Math.abs(w.value - w.oracle);
        worstRows.push([b.name, "[" + w.index.join(", ") + "]", w.value === null ? "NaN/Inf" : fmt(w.value), fmt(w.oracle), diff === null ? "–" : fmt(diff)]);
      }
    }
    if (worstRows.length) {
      const det = add(sec, "details", { class: "worst", open: "" });
      add(det, "summary", {}, "worst elements (index [b, t, h, ...])");
      gridTable(det, ["backend", "index", "value", "oracle", "|diff|"], worstRows, "worst");
    }
  }

  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
  const PLOT_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
  // plotly's toolbar sits in the top right corner of a plot, over the top margin: titles start at the
  // left and legends below the plot or, beside it, below a top margin of TOOLBAR_CLEAR px
  const TOOLBAR_CLEAR = 36;
  function plotTitle(text) { return { text: plotText(text), font: { size: 13 }, x: 0, xref: "paper", xanchor: "left" }; }
  function chunkCentre(j, C, T) { return (j * C + Math.min((j + 1) * C, T)) / 2; }
  function drawProfile(div, d, name, backends) {
    const first = backends[0].tensors[name];
    const timeAxis = !!first.heatmap;
    const C = (d.case || {}).chunk_size || 1;
    const T = (d.case || {}).T || C;
    const traces = backends.map((b, i) => {
      const p = b.tensors[name].profile;
      return { type: "scatter", mode: "lines+markers", name: plotText(b.name), line: { color: COLORS[i % COLORS.length] },
               x: p.map((_, j) => timeAxis ? chunkCentre(j, C, T) : j), y: p.map(v => (v === null || v <= 0) ? null : v), connectgaps: false };
    });
    const n = first.profile.length;
    const xs = timeAxis ? [0, T] : [-0.5, Math.max(1, n - 1) + 0.5];
    traces.push({ type: "scatter", mode: "lines", name: "tolerance", x: xs, y: [first.tol, first.tol], line: { dash: "dash", color: "#000" } });
    if (first.floor_rel > 0) traces.push({ type: "scatter", mode: "lines", name: "dtype floor", x: xs, y: [first.floor_rel, first.floor_rel], line: { dash: "dot", color: "#888" } });
    return Plotly.newPlot(div, traces, {
      title: plotTitle(`${name}: rel error per ${timeAxis ? "chunk" : "row"}`),
      xaxis: { title: { text: timeAxis ? `t (points at chunk centres, C=${C})` : "row of the state (sequence)" }, zeroline: false,
               range: xs, dtick: timeAxis ? undefined : 1 },
      yaxis: { title: { text: "rel rms error" }, type: "log", exponentformat: "e" },
      margin: { l: 60, r: 10, t: 30, b: 80 }, height: 290, legend: { orientation: "h", y: -0.32 },
    }, PLOT_CONFIG);
  }
  function drawHeatmap(div, d, name, backends) {
    const C = (d.case || {}).chunk_size || 1;
    const T = (d.case || {}).T || C;
    const tol = backends[0].tensors[name].tol;
    const k = backends.length, gap = 0.06, w = (1 - gap * (k - 1)) / k;
    const layout = {
      title: plotTitle(`${name}: rel error per (chunk, head), log10`),
      coloraxis: { colorscale: "RdBu", cmid: Math.log10(tol),
                   colorbar: { title: { text: "log10 err<br>(mid = tol)" }, thickness: 12 } },
      margin: { l: 50, r: 10, t: 40, b: 50 }, height: 290, annotations: [],
    };
    const traces = backends.map((b, i) => {
      const hm = b.tensors[name].heatmap;  // [n_chunks][H]
      const H = hm.length ? hm[0].length : 0;
      const ax = i === 0 ? "" : String(i + 1);
      layout["xaxis" + ax] = { domain: [i * (w + gap), i * (w + gap) + w], title: { text: "t" }, anchor: "y" + ax,
                               range: [0, T], zeroline: false };
      layout["yaxis" + ax] = { title: { text: i === 0 ? "head" : "" }, anchor: "x" + ax, dtick: 1, range: [-0.5, H - 0.5], zeroline: false };
      const t = b.tensors[name];
      const nonfinite = t.nan || t.inf;
      layout.annotations.push({ text: plotText(b.name + (nonfinite ? " (finite elements only)" : "")), x: i * (w + gap) + w / 2, y: 1.0,
                                xref: "paper", yref: "paper", xanchor: "center", yanchor: "bottom", showarrow: false, font: { size: 11 } });
      if (!hm.some(row => row.some(v => v > 0))) {
        layout.annotations.push({ text: nonfinite ? "NaN/Inf: no finite<br>error to map" : "zero error<br>everywhere",
                                  x: i * (w + gap) + w / 2, y: 0.5, xref: "paper", yref: "paper", showarrow: false, font: { size: 12, color: "#cf222e" } });
      }
      const z = [];
      for (let h = 0; h < H; h++) z.push(hm.map(row => (row[h] === null || row[h] <= 0) ? null : Math.log10(row[h])));
      return { type: "heatmap", coloraxis: "coloraxis", xaxis: "x" + ax, yaxis: "y" + ax, z: z,
               x: hm.map((_, j) => chunkCentre(j, C, T)), y: [...Array(H).keys()], hoverongaps: false,
               hovertemplate: "t≈%{x}, head %{y}: 10^%{z:.2f}<extra></extra>" };
    });
    return Plotly.newPlot(div, traces, layout, PLOT_CONFIG);
  }

  // the bound scatter on the summary: one trace per (verdict, dtype); a click opens the point's case
  const BOUND_COLORS = { "pass": "#1a7f37", "fail-bound": "#cf222e", "fail-accuracy": "#cf222e", "nan-inf": "#cf222e", "inconclusive": "#bf8700" };
  const DTYPE_SYMBOLS = ["circle", "diamond", "square", "triangle-up", "x"];
  function boundHover(p) {
    const zero = k => p.clamped.includes(k) ? " (0: at the rounding level, drawn at the floor)" : "";
    const lines = [`${p.case} [${p.candidate}] ${p.tensor}`, `verdict ${p.verdict}, ${p.dtype}, method ${p.method}`,
      `reference compute error ${fmt(p.x)}${zero("x")}`, `candidate compute error ${fmt(p.y)}${zero("y")}`];
    if (p.method === "ratio") lines.push(`ratio ${fmt(p.ratio)} [${fmt(p.lo)}, ${fmt(p.hi)}]`);
    if (p.margin) lines.push(p.margin);
    lines.push(`${p.seeds} seed(s)`);
    return lines.map(plotText).join("<br>");
  }
  function drawBound() {
    const div = document.getElementById("bound-scatter");
    const b = data.bound;
    if (!div || div.dataset.state || !b.points.length) return;
    div.dataset.state = "loading";
    loadPlotly().then(() => {
      const dtypes = [...new Set(b.points.map(p => p.dtype))].sort();
      const groups = new Map();
      for (const p of b.points) {
        const key = p.verdict + " " + p.dtype;
        if (!groups.has(key)) groups.set(key, []);
        groups.get(key).push(p);
      }
      const traces = [...groups.entries()].sort((a, b2) => rank(b2[1][0].verdict) - rank(a[1][0].verdict)).map(([key, ps]) => ({
        type: "scatter", mode: "markers", name: plotText(key), x: ps.map(p => p.x), y: ps.map(p => p.y),
        customdata: ps.map(p => p.case), text: ps.map(boundHover), hovertemplate: "%{text}<extra></extra>",
        marker: { color: BOUND_COLORS[ps[0].verdict] || "#57606a", size: 8, opacity: 0.85,
                  symbol: DTYPE_SYMBOLS[dtypes.indexOf(ps[0].dtype) % DTYPE_SYMBOLS.length] },
        error_y: { type: "data", symmetric: false, visible: true, thickness: 1, width: 0,
                   array: ps.map(p => p.y_hi === null ? 0 : p.y_hi - p.y), arrayminus: ps.map(p => p.y_lo === null ? 0 : p.y - p.y_lo) },
      }));
      const all = b.points.flatMap(p => [p.x, p.y, p.y_lo || p.y, p.y_hi || p.y]);
      const lo = all.reduce((a, v) => Math.min(a, v), Infinity) / 2, hi = all.reduce((a, v) => Math.max(a, v), 0) * 2;
      traces.push({ type: "scatter", mode: "lines", name: plotText(`bound y = ${b.factor} x`), x: [lo, hi],
                    y: [b.factor * lo, b.factor * hi], line: { color: "#000" }, hoverinfo: "skip" });
      traces.push({ type: "scatter", mode: "lines", name: plotText(`indifference edge y = ${fmt(b.edge)} x`), x: [lo, hi],
                    y: [b.edge * lo, b.edge * hi], line: { color: "#000", dash: "dash" }, hoverinfo: "skip" });
      return Plotly.newPlot(div, traces, {
        xaxis: { title: { text: "reference's compute error" }, type: "log", exponentformat: "e" },
        yaxis: { title: { text: "candidate's compute error" }, type: "log", exponentformat: "e" },
        margin: { l: 70, r: 10, t: TOOLBAR_CLEAR, b: 50 }, height: 420, hovermode: "closest",
      }, PLOT_CONFIG).then(() => {
        div.on("plotly_click", ev => { const pt = ev.points[0]; if (pt && pt.customdata !== undefined) location.hash = caseHref(pt.customdata); });
        div.dataset.points = String(b.points.length);
        div.dataset.state = "ready";
      });
    }).catch(e => {
      div.dataset.state = "error";
      div.replaceChildren(el("p", { class: "warn" }, `plot unavailable: ${e.message || e}`));
    });
  }

  async function openCase(n) {
    summarySection.hidden = true;
    casesSection.hidden = true;
    detail.hidden = false;
    detail.dataset.state = "loading";
    body.replaceChildren(el("p", {}, "loading case " + n + " ..."));
    window.scrollTo(0, 0);
    let d, plotly;
    try {
      [d, plotly] = await Promise.all([loadCase(n), loadPlotly().catch(() => null)]);
    } catch (e) {
      body.replaceChildren(el("p", { class: "warn" }, String(e.message || e)));
      detail.dataset.state = "error";
      return;
    }
    body.replaceChildren();
    plots.length = 0;
    renderHeader(d);
    renderStages(d);
    renderBackends(d);
    renderCompile(d);
    add(body, "h3", {}, "Tensors");
    for (const name of d.tensor_order) renderTensor(d, name);
    if (!plotly) add(body, "p", { class: "warn" }, `plots unavailable: ${ASSETS}/plotly.min.js could not be loaded`);
    else await Promise.all(plots.map(f => f()));
    detail.dataset.plots = String(plotly ? plots.length : 0);
    detail.dataset.state = "ready";
  }

  function showIndex() {
    detail.hidden = true;
    summarySection.hidden = false;
    casesSection.hidden = false;
    detail.dataset.state = "";
    drawBound();
  }

  // "#case=<id>" (percent-encoded or as typed) opens that case; "#case=<n>" (a row number) still does
  // when no case has that id. A link to a case this report does not hold says so over the table.
  const rowById = new Map(rows.map(r => [r.id, r.n]));
  function caseFromHash(hash) {
    const raw = hash.slice("#case=".length);
    let id = raw;
    try { id = decodeURIComponent(raw); } catch (e) { /* a lone '%' in the id: take the text as written */ }
    if (rowById.has(id)) return rowById.get(id);
    if (rowById.has(raw)) return rowById.get(raw);
    return /^\d+$/.test(id) && Number(id) < rows.length ? Number(id) : { missing: id };
  }
  function route() {
    const warn = document.getElementById("route-warn");
    warn.hidden = true;
    const n = location.hash.startsWith("#case=") ? caseFromHash(location.hash) : null;
    if (typeof n === "number") { openCase(n); return; }
    if (n) { warn.textContent = `no case "${n.missing}" in this report`; warn.hidden = false; }
    showIndex();
  }

  buildHeader();
  setupFilters();
  render();
  document.getElementById("back").addEventListener("click", e => { e.preventDefault(); location.hash = ""; });
  window.addEventListener("hashchange", route);
  route();
  document.body.dataset.ready = "1";
})();
