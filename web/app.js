// Lathe's dashboard: a tenant's jobs, sessions, live loss and eval curves, evaluation tables and
// artifacts; on the scheduler's operator port, the operator's queues, shares and fairness.
// It calls the same HTTP API as every client (docs/openapi.yaml) with the key the user types,
// kept in this tab's sessionStorage only. No framework, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
let key = sessionStorage.getItem("lathe-key") || "";
let current = null;      // the job shown in the detail pane
let stream = null;       // its event stream's AbortController
let points = [];         // [{step, loss}] training loss
let evalPoints = [];     // [{step, loss}] evaluation loss

async function api(method, path, body, type) {
  const headers = { Authorization: `Bearer ${key}` };
  if (body !== undefined && type) headers["Content-Type"] = type;
  const r = await fetch(path, { method, headers, body });
  const text = await r.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (e) { json = null; }
  if (!r.ok) {
    const msg = json && json.error ? json.error.message : `${r.status} ${r.statusText}`;
    throw new Error(msg);
  }
  return json;
}

function cell(tr, text) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null ? "" : String(text);
  tr.appendChild(td);
}

function when(ms) { return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : ""; }

// ---------------------------------------------------------------- tenant view

async function refreshLists() {
  const jobs = await api("GET", "/v1/jobs?limit=50");
  const tbody = $("jobs").tBodies[0];
  tbody.replaceChildren();
  for (const j of jobs.jobs) {
    const tr = document.createElement("tr");
    tr.className = "pick" + (current === j.id ? " on" : "");
    tr.dataset.id = j.id;
    [j.id, j.state, j.priority, j.base_model, when(j.submitted_at)].forEach((v) => cell(tr, v));
    tr.addEventListener("click", () => show(j.id));
    tbody.appendChild(tr);
  }
  const sessions = await api("GET", "/v1/sessions?limit=50");
  const sb = $("sessions").tBodies[0];
  sb.replaceChildren();
  for (const s of sessions.data) {
    const tr = document.createElement("tr");
    [s.id, s.state, s.base_model, when(s.submitted_at)].forEach((v) => cell(tr, v));
    sb.appendChild(tr);
  }
}

function draw() {
  const c = $("loss");
  const g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const all = points.concat(evalPoints);
  c.dataset.points = String(points.length);
  c.dataset.evals = String(evalPoints.length);
  if (!all.length) return;
  const pad = 36;
  const maxStep = Math.max(1, ...all.map((p) => p.step));
  const losses = all.map((p) => p.loss);
  let lo = Math.min(...losses), hi = Math.max(...losses);
  if (hi - lo < 1e-9) { hi += 0.5; lo -= 0.5; }
  const x = (s) => pad + (c.width - 2 * pad) * (s / maxStep);
  const y = (l) => c.height - pad - (c.height - 2 * pad) * ((l - lo) / (hi - lo));
  g.strokeStyle = "#9aa3b2";
  g.beginPath(); g.moveTo(pad, pad / 2); g.lineTo(pad, c.height - pad); g.lineTo(c.width - pad / 2, c.height - pad); g.stroke();
  g.fillStyle = "#4a5263";
  g.font = "11px system-ui";
  g.fillText(hi.toFixed(3), 2, y(hi) + 4);
  g.fillText(lo.toFixed(3), 2, y(lo) + 4);
  g.fillText(`step ${maxStep}`, c.width - pad - 30, c.height - pad + 16);
  const line = (pts, color) => {
    g.strokeStyle = color; g.fillStyle = color; g.lineWidth = 2;
    g.beginPath();
    pts.forEach((p, i) => (i ? g.lineTo(x(p.step), y(p.loss)) : g.moveTo(x(p.step), y(p.loss))));
    g.stroke();
    pts.forEach((p) => { g.beginPath(); g.arc(x(p.step), y(p.loss), 2.5, 0, 7); g.fill(); });
  };
  line(points, "#2458d6");
  line(evalPoints, "#d6572b");
}

function evalLoss(metrics) {
  if (!metrics) return null;
  if (Array.isArray(metrics)) {
    const m = metrics.find((x) => x.name === "loss" || x.name === "eval_loss" || x.name === "val_loss");
    return m ? m.value : null;
  }
  return metrics.loss ?? metrics.eval_loss ?? metrics.val_loss ?? null;
}

async function refreshJob() {
  if (!current) return;
  const j = await api("GET", `/v1/jobs/${current}`);
  $("state").textContent = j.state;
  const p = j.progress;
  $("progress").textContent = p ? `step ${p.step}/${p.total_steps}` : "";
  $("cancel").hidden = ["completed", "failed", "cancelled", "rejected"].includes(j.state);
  const tb = $("evals").tBodies[0];
  tb.replaceChildren();
  evalPoints = [];
  for (const e of j.evals || []) {
    const ms = Array.isArray(e.metrics) ? e.metrics : Object.entries(e.metrics || {}).map(([name, value]) => ({ name, value }));
    for (const m of ms) {
      const tr = document.createElement("tr");
      [e.step, m.name, typeof m.value === "number" ? m.value.toFixed(4) : m.value,
        typeof m.base_value === "number" ? m.base_value.toFixed(4) : ""].forEach((v) => cell(tr, v));
      tb.appendChild(tr);
    }
    const l = evalLoss(e.metrics);
    if (typeof l === "number") evalPoints.push({ step: e.step, loss: l });
  }
  const ul = $("artifacts");
  ul.replaceChildren();
  for (const a of j.artifacts || []) {
    const li = document.createElement("li");
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = `${a.name} (${a.bytes} bytes)`;
    b.addEventListener("click", () => download(current, a.name));
    li.appendChild(b);
    ul.appendChild(li);
  }
  draw();
}

async function download(job, name) {
  const r = await fetch(`/v1/jobs/${job}/artifacts/${encodeURIComponent(name)}`, { headers: { Authorization: `Bearer ${key}` } });
  if (!r.ok) return;
  const url = URL.createObjectURL(await r.blob());
  const a = document.createElement("a");
  a.href = url; a.download = name; a.click();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// The job's Server-Sent Events through fetch (EventSource cannot send the key), resumed with
// Last-Event-ID when the connection drops.
async function follow(job) {
  if (stream) stream.abort();
  const ctl = new AbortController();
  stream = ctl;
  let last = null;
  for (let tries = 0; tries < 30 && current === job && !ctl.signal.aborted; tries++) {
    try {
      const headers = { Authorization: `Bearer ${key}` };
      if (last) headers["Last-Event-ID"] = last;
      const r = await fetch(`/v1/jobs/${job}/events`, { headers, signal: ctl.signal });
      if (!r.ok) return;
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "", ev = {};
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).replace(/\r$/, "");
          buf = buf.slice(nl + 1);
          if (line === "") {
            if (ev.event) { if (ev.id) last = ev.id; if (onEvent(job, ev)) return; }
            ev = {};
          } else if (!line.startsWith(":")) {
            const i = line.indexOf(":");
            const f = i < 0 ? line : line.slice(0, i), v = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
            ev[f] = ev[f] ? ev[f] + "\n" + v : v;
          }
        }
      }
    } catch (e) {
      if (ctl.signal.aborted) return;
    }
    await new Promise((res) => setTimeout(res, 1000));
  }
}

// One event of the shown job; true when the stream is over.
function onEvent(job, ev) {
  if (job !== current) return true;
  if (ev.event === "end") { refreshJob().catch(() => {}); refreshLists().catch(() => {}); return true; }
  let d = {};
  try { d = JSON.parse(ev.data); } catch (e) { return false; }
  if (ev.event === "StepCompleted" && typeof d.loss === "number") {
    points = points.filter((p) => p.step !== d.step);
    points.push({ step: d.step, loss: d.loss });
    points.sort((a, b) => a.step - b.step);
    $("progress").textContent = `step ${d.step}/${d.total_steps}`;
    draw();
  } else if (ev.event === "AttemptStarted") {
    points = points.filter((p) => p.step <= (d.resume_step || 0));
  }
  if (d.state) $("state").textContent = d.state;
  if (["EvalCompleted", "ArtifactPublished", "JobCompleted", "JobFailed", "JobCancelled"].includes(ev.event))
    refreshJob().catch(() => {});
  return false;
}

function show(id) {
  current = id;
  points = [];
  evalPoints = [];
  $("detail").hidden = false;
  $("detail-title").textContent = id;
  for (const tr of $("jobs").tBodies[0].rows) tr.classList.toggle("on", tr.dataset.id === id);
  refreshJob().catch((e) => { $("state").textContent = e.message; });
  follow(id);
}

async function startJob(ev) {
  ev.preventDefault();
  const f = $("file").files[0];
  const status = $("newjob-status");
  status.className = "";
  try {
    status.textContent = "uploading...";
    const ds = await api("POST", `/v1/datasets?name=${encodeURIComponent(f.name)}`, await f.arrayBuffer(), "application/x-ndjson");
    status.textContent = `dataset ${ds.id}: starting...`;
    const hp = { max_steps: Number($("max_steps").value), learning_rate: Number($("lr").value) };
    const job = await api("POST", "/v1/jobs", JSON.stringify({ base_model: $("model").value, dataset_id: ds.id, hyperparameters: hp }),
      "application/json");
    status.textContent = `job ${job.id} submitted`;
    await refreshLists();
    show(job.id);
  } catch (e) {
    status.className = "error";
    status.textContent = e.message;
  }
}

async function signIn(ev) {
  if (ev) ev.preventDefault();
  if (!key) key = $("key").value.trim();
  try {
    await refreshLists();
  } catch (e) {
    $("signin-error").textContent = e.message;
    key = "";
    sessionStorage.removeItem("lathe-key");
    $("signin-view").hidden = false;
    return;
  }
  sessionStorage.setItem("lathe-key", key);
  $("signin-view").hidden = true;
  $("tenant-view").hidden = false;
  $("who").textContent = `key ${key.split("_")[1] || ""}`;
  setInterval(() => refreshLists().catch(() => {}), 5000);
}

// ---------------------------------------------------------------- operator view

async function refreshOperator() {
  const r = await fetch("/v1/admin/queue");
  const q = await r.json();
  const fleet = $("fleet").tBodies[0];
  fleet.replaceChildren();
  for (const [k, v] of Object.entries(q.fleet || {})) {
    const tr = document.createElement("tr");
    cell(tr, k.replaceAll("_", " "));
    cell(tr, typeof v === "number" && !Number.isInteger(v) ? v.toFixed(2) : v);
    fleet.appendChild(tr);
  }
  const workers = $("workers").tBodies[0];
  workers.replaceChildren();
  for (const w of q.workers || []) {
    const tr = document.createElement("tr");
    [w.id, w.slots, w.up ? "yes" : "NO", w.draining ? "yes" : "", w.last_heartbeat_s.toFixed(1), w.node_group].forEach((v) => cell(tr, v));
    workers.appendChild(tr);
  }
  const jain = $("jain").tBodies[0];
  jain.replaceChildren();
  for (const [k, v] of Object.entries(q.jain || {})) {
    const tr = document.createElement("tr");
    cell(tr, k); cell(tr, v.toFixed(3));
    jain.appendChild(tr);
  }
  const rows = $("queue").tBodies[0];
  rows.replaceChildren();
  for (const x of q.rows || []) {
    const tr = document.createElement("tr");
    [x.tenant, x.class, x.weight, x.queued, x.running_slots, x.share.toFixed(3), x.entitlement.toFixed(3),
      x.wait_p50_s.toFixed(1), x.wait_p99_s.toFixed(1), x.gpu_hours.toFixed(3), x.cold_loads].forEach((v) => cell(tr, v));
    rows.appendChild(tr);
  }
}

// ---------------------------------------------------------------- start

async function start() {
  // The scheduler's operator port answers /v1/admin/queue on this origin; the api does not.
  let operator = false;
  try {
    const r = await fetch("/v1/admin/queue");
    operator = r.ok && (r.headers.get("Content-Type") || "").includes("json") && "fleet" in (await r.json());
  } catch (e) { operator = false; }
  if (operator) {
    $("operator-view").hidden = false;
    $("who").textContent = "operator";
    await refreshOperator();
    setInterval(() => refreshOperator().catch(() => {}), 5000);
    return;
  }
  $("signin-form").addEventListener("submit", signIn);
  $("newjob").addEventListener("submit", startJob);
  $("cancel").addEventListener("click", () => current && api("POST", `/v1/jobs/${current}/cancel`).then(refreshJob).catch(() => {}));
  if (key) await signIn();
  else $("signin-view").hidden = false;
}

start();
