// convplane console: plain JavaScript, no build step, nothing loaded from elsewhere.
//
// Data: the plane's shared state (regions, placement, drills, halt, audit: the control shard,
// the same at every node) comes from one *source* region; each region's own figures (shards it
// leads and their epochs, appends, replay) come from that region itself (GET /v1/console/node).
// The source is the node that served this page unless it stops answering or is the target of a
// running region-loss or kill drill (its view is the cut-off side's); then the next region that
// answers. Every request has a timeout, so a black-holed node never stalls the page.
//
// The key is typed into the page, kept in sessionStorage (this tab only) and sent as a bearer
// header; it never goes into a URL. The server decides what a key may do: a viewer's action is
// sent like an operator's, and the page shows the server's 403.
"use strict";

(() => {
  const POLL_MS = 1000;
  const REQUEST_TIMEOUT_MS = 2500;
  const DEADLINE_HEADER_MS = "2000";
  const SOURCE_RETRY_MS = 10000; // a source that failed is tried again only after this
  // an action every region refused with an error the server calls retryable (a quorum or a
  // leader lost for a moment, as under load or during a move) is sent again until this passes
  const ACTION_RETRY_MS = 20000;
  const RETRY_WAIT_MIN_MS = 250;
  const RETRY_WAIT_MAX_MS = 2000;
  const STALE_AFTER_MS = 5000; // shared state older than this is flagged
  const AUDIT_KEPT = 200;
  const AUDIT_PAGES_PER_TICK = 5;
  const AUDIT_PAGE = 1000;
  const DRILLS_LISTED = 25;
  const PRACTICE_LISTED = 25;
  const BANNERS_KEPT = 4;
  const KEY_ITEM = "convplane.console.key";
  const URLS_ITEM = "convplane.console.urls";
  const TERMINAL = new Set(["done", "aborted", "failed"]);
  const FAULT_PHASES = new Set(["injecting", "holding"]);
  const PHASES = ["planned", "preflight", "injecting", "holding", "restoring", "done"];
  const REGION_COLORS = ["#4e79a7", "#e07b1f", "#8e5ea2", "#2a9d8f", "#b8860b", "#9c755f", "#d45087", "#5a6a82"];

  const state = {
    key: sessionStorage.getItem(KEY_ITEM),
    home: null, // the region whose node served this page
    urls: {}, // region -> base URL ("" for the home region: same origin)
    names: [], // regions in the cluster file's order (colours, rows)
    order: [], // regions, home first (the preference of sources)
    you: null,
    source: null,
    sourceFailedAt: {},
    sourceError: {},
    regions: null,
    placement: null,
    drills: null,
    halt: null,
    readiness: null, // GET /v1/readiness: the control leader's last evaluation
    activeReport: null,
    sharedAt: 0,
    audit: [],
    practice: null, // GET /v1/practice/calendar
    practiceOverview: null, // GET /v1/practice: schedules, runs (those awaiting approval)
    auditAfter: 0,
    nodes: {}, // region -> {body, at, error}
    openReport: null,
    timer: null,
    banners: [],
  };

  const $ = (id) => document.getElementById(id);

  // --- DOM helpers: text only, never HTML from data ----------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "onclick") el.addEventListener("click", v);
      else if (k === "style") Object.assign(el.style, v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function fill(el, ...children) {
    el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  }

  const fmt = {
    num(v, digits = 1) {
      if (v === null || v === undefined) return "–";
      return Number(v).toLocaleString("en-US", { maximumFractionDigits: digits });
    },
    pct(v) {
      return v === null || v === undefined ? "–" : `${(v * 100).toFixed(v > 0 && v < 0.01 ? 2 : 1)}%`;
    },
    secs(v) {
      return v === null || v === undefined ? "–" : `${Number(v).toFixed(2)} s`;
    },
    ago(ms) {
      const s = (Date.now() - ms) / 1000;
      return s < 60 ? `${s.toFixed(s < 10 ? 1 : 0)} s ago` : `${Math.round(s / 60)} min ago`;
    },
    utc(value) {
      if (value === null || value === undefined) return "–";
      const d = typeof value === "number" ? new Date(value) : new Date(value);
      return d.toISOString().slice(11, 19);
    },
    utcDate(value) {
      if (!value) return "–";
      return new Date(value).toISOString().slice(0, 19).replace("T", " ");
    },
  };

  // --- requests ------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(region, status, code, message, retryable = false, retryAfterMs = 0) {
      super(message);
      this.region = region;
      this.status = status; // 0: no answer (network, timeout)
      this.code = code;
      this.retryable = retryable; // the server's word: sending it again is safe and may succeed
      this.retryAfterMs = retryAfterMs; // its Retry-After, where the browser lets the page read it
    }
    // whether another region might answer where this one did not
    get regionFailed() {
      return this.status === 0 || this.status >= 500;
    }
  }

  async function api(region, method, path, body, accept) {
    const headers = {
      Authorization: `Bearer ${state.key}`,
      "X-Convplane-Deadline-Ms": DEADLINE_HEADER_MS,
      Accept: accept || "application/json",
    };
    const init = { method, headers, cache: "no-store", referrerPolicy: "no-referrer", signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const base = region === null ? "" : state.urls[region] ?? "";
    let response;
    try {
      response = await fetch(base + path, init);
    } catch (exc) {
      const why = exc && exc.name === "TimeoutError" ? "no answer within 2.5 s" : "unreachable";
      throw new ApiError(region, 0, "unreachable", why);
    }
    if (accept === "text/html" && response.ok) return response.text();
    let parsed = null;
    try {
      parsed = await response.json();
    } catch (exc) {
      parsed = null;
    }
    if (!response.ok) {
      const err = (parsed && parsed.error) || {};
      const retryAfterS = Number(response.headers.get("Retry-After"));
      throw new ApiError(region, response.status, err.code || `http_${response.status}`, err.message || response.statusText,
        err.retryable === true, Number.isFinite(retryAfterS) && retryAfterS > 0 ? retryAfterS * 1000 : 0);
    }
    return parsed;
  }

  // --- banners -------------------------------------------------------------------------------

  function banner(kind, text) {
    state.banners.unshift({ kind, text, at: Date.now() });
    state.banners = state.banners.slice(0, BANNERS_KEPT);
    renderBanners();
  }

  function bannerForError(what, err) {
    if (err.status === 403) {
      const role = state.you ? `${state.you.tenant_id} is a ${state.you.role} key` : "this key";
      banner("forbidden", `403 forbidden: ${what} refused by ${err.region || state.home}: ${err.message}. ` +
        `(${role}; a viewer key sees everything and changes nothing.)`);
    } else if (err.status === 0) {
      banner("error", `${what} failed: ${err.region} ${err.message}; nothing is known to have changed`);
    } else {
      banner("error", `${what} failed: ${err.status} ${err.code}: ${err.message}`);
    }
  }

  function renderBanners() {
    fill($("banners"), state.banners.map((b, i) =>
      h("div", { class: `banner ${b.kind}`, "data-kind": b.kind },
        h("span", { class: "text" }, b.text),
        h("span", { class: "when" }, fmt.utc(b.at), " UTC"),
        h("button", { type: "button", title: "dismiss", onclick: () => { state.banners.splice(i, 1); renderBanners(); } }, "×"))));
  }

  // --- confirmation dialog -------------------------------------------------------------------

  // defaultReason null: the action records no reason (the reason field is hidden)
  function confirmAction(title, text, defaultReason, onConfirm) {
    const dialog = $("confirm");
    const asksReason = defaultReason !== null;
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    $("confirm-reason").value = defaultReason || "";
    $("confirm-reason").hidden = !asksReason;
    $("confirm-reason-label").hidden = !asksReason;
    const ok = $("confirm-ok");
    const cancel = $("confirm-cancel");
    const close = () => {
      ok.onclick = null;
      cancel.onclick = null;
      dialog.close();
    };
    cancel.onclick = close;
    ok.onclick = () => {
      const reason = $("confirm-reason").value.trim();
      if (asksReason && !reason) {
        $("confirm-reason").focus();
        return;
      }
      close();
      onConfirm(reason);
    };
    dialog.showModal();
    if (asksReason) $("confirm-reason").select();
  }

  // --- operator actions: sent as they are; the server decides (one it calls retryable, again) -

  async function act(what, method, path, body) {
    const giveUpAt = Date.now() + ACTION_RETRY_MS;
    for (;;) {
      let refusal = null;
      for (const region of sourceCandidates()) {
        try {
          const result = await api(region, method, path, body);
          banner("ok", `${what}: accepted by ${region}`);
          tick(true);
          return result;
        } catch (err) {
          refusal = err;
          if (!(err instanceof ApiError && err.regionFailed)) break; // the server's answer
        }
      }
      if (refusal === null) return null;
      const waitMs = Math.min(Math.max(refusal.retryAfterMs || 0, RETRY_WAIT_MIN_MS), RETRY_WAIT_MAX_MS);
      if (!(refusal instanceof ApiError && refusal.retryable) || Date.now() + waitMs > giveUpAt) {
        bannerForError(what, refusal);
        return null;
      }
      banner("warn", `${what}: ${refusal.status} ${refusal.code}: ${refusal.message}; sending it again in ${(waitMs / 1000).toFixed(1)} s`);
      await new Promise((resolve) => setTimeout(resolve, waitMs));
    }
  }

  function abortDrill(drill) {
    confirmAction(`Abort drill ${drill.drill_id}?`,
      `${drill.kind} of ${drill.region}, now ${drill.phase}. The target is restored at once; the verdict will be "aborted".`,
      "aborted from the console",
      (reason) => act(`abort of drill ${drill.drill_id}`, "POST", `/v1/drills/${encodeURIComponent(drill.drill_id)}/abort`, { reason }));
  }

  function toggleHalt() {
    const on = state.halt && state.halt.on;
    if (on) {
      confirmAction("Lift the halt switch?", "Drills may start again.", "incident over",
        (reason) => act("lifting the halt", "DELETE", `/v1/admin/halt?reason=${encodeURIComponent(reason)}`));
    } else {
      confirmAction("Halt every drill?", "Aborts every active drill (targets restored at once) and refuses new ones until the halt is lifted.",
        "halted from the console", (reason) => act("halt", "POST", "/v1/admin/halt", { reason }));
    }
  }

  function approveRun(run) {
    confirmAction(`Approve practice run ${run.run_id}?`,
      `${run.kind} of ${run.region}, hold ${run.hold_s} s, asked for by ${run.requested_by}: “${run.reason}”. ` +
      "It starts at the control leader's next practice tick. The requester's own key, or one in its line of descent, is refused.",
      null,
      () => act(`approval of run ${run.run_id}`, "POST", `/v1/practice/runs/${encodeURIComponent(run.run_id)}/approve`));
  }

  function deleteSchedule(schedule) {
    confirmAction(`Delete schedule ${schedule.schedule_id}?`,
      `Its ${schedule.kind} drills of ${schedule.region} stop being scheduled; its calendar entries stay.`,
      null,
      () => act(`deletion of schedule ${schedule.schedule_id}`, "DELETE", `/v1/practice/schedules/${encodeURIComponent(schedule.schedule_id)}`));
  }

  function editSchedule(schedule) {
    $("schedule-id").value = schedule.schedule_id;
    $("schedule-region").value = schedule.region;
    $("schedule-kind").value = schedule.kind;
    $("schedule-windows").value = schedule.windows.join(", ");
    $("schedule-hold").value = schedule.hold_s;
    $("schedule-interval").value = schedule.min_interval_s / 3600;
    $("schedule-approval").checked = schedule.needs_approval;
    $("schedule-id").focus();
  }

  // the form writes what the API takes; the server checks it (a bad window is its 400, shown).
  // Saving over an existing schedule keeps what the form does not show (chance, blocked dates,
  // retry after a skip, enabled, guards).
  function saveSchedule(event) {
    event.preventDefault();
    const id = $("schedule-id").value.trim();
    const existing = ((state.practiceOverview && state.practiceOverview.schedules) || []).find((sc) => sc.schedule_id === id);
    const kept = existing ? {
      chance: existing.chance, blocked_dates: existing.blocked_dates,
      retry_after_skip_s: existing.retry_after_skip_s, enabled: existing.enabled,
      guards: existing.guards,
    } : {};
    const body = {
      ...kept,
      region: $("schedule-region").value,
      kind: $("schedule-kind").value,
      windows: $("schedule-windows").value.split(",").map((w) => w.trim()).filter(Boolean),
      hold_s: Number($("schedule-hold").value),
      min_interval_s: Number($("schedule-interval").value) * 3600,
      needs_approval: $("schedule-approval").checked,
    };
    act(`schedule ${id}`, "PUT", `/v1/practice/schedules/${encodeURIComponent(id)}`, body);
  }

  const KINDS = ["evacuate", "region-loss", "kill"];

  // a row of checkboxes named ``group``, ticked where ``ticked`` (a list; null: none)
  function checkboxes(group, values, ticked) {
    return values.map((v) => h("label", {},
      h("input", { type: "checkbox", "data-group": group, value: v, checked: (ticked || []).includes(v) }), ` ${v}`));
  }

  function ticked(group) {
    return [...document.querySelectorAll(`input[data-group="${group}"]:checked`)].map((i) => i.value);
  }

  function savePolicy(event) {
    event.preventDefault();
    act("approval policy", "PUT", "/v1/practice/approval-policy",
      { regions: ticked("policy-regions"), kinds: ticked("policy-kinds") });
  }

  // no region (or kind) ticked: any, as the API's null
  function saveScope(event) {
    event.preventDefault();
    const key = $("scope-key").value.trim();
    const regions = ticked("scope-regions");
    const kinds = ticked("scope-kinds");
    act(`blast radius of ${key}`, "PUT", `/v1/practice/scopes/${encodeURIComponent(key)}`,
      { regions: regions.length ? regions : null, kinds: kinds.length ? kinds : null });
  }

  function editScope(key, scope) {
    $("scope-key").value = key;
    fill($("scope-regions"), checkboxes("scope-regions", regionNames(), scope.regions));
    fill($("scope-kinds"), checkboxes("scope-kinds", KINDS, scope.kinds));
  }

  function regionNames() {
    return state.regions ? state.regions.regions.map((r) => r.name) : [];
  }

  function regionAction(name, action) {
    const text = action === "evacuate"
      ? `Move every shard ${name} leads to the other regions (planned handoff, no acknowledged loss).`
      : `Let ${name} take its shards back (gradually, after its hysteresis window).`;
    confirmAction(`${action === "evacuate" ? "Evacuate" : "Restore"} ${name}?`, text, `${action} from the console`,
      (reason) => act(`${action} of ${name}`, "POST",
        `/v1/admin/regions/${encodeURIComponent(name)}/${action}?reason=${encodeURIComponent(reason)}`));
  }

  async function downloadReport(drillId) {
    for (const region of sourceCandidates()) {
      try {
        const html = await api(region, "GET", `/v1/drills/${encodeURIComponent(drillId)}/report`, undefined, "text/html");
        const link = h("a", { href: URL.createObjectURL(new Blob([html], { type: "text/html" })), download: `drill-${drillId}.html` });
        document.body.append(link);
        link.click();
        link.remove();
        return;
      } catch (err) {
        if (!(err instanceof ApiError && err.regionFailed)) {
          bannerForError(`report of ${drillId}`, err);
          return;
        }
      }
    }
    banner("error", `report of ${drillId}: no region answered`);
  }

  async function showReport(drillId) {
    state.openReport = { drill_id: drillId, body: null };
    renderReport();
    for (const region of sourceCandidates()) {
      try {
        state.openReport = { drill_id: drillId, body: await api(region, "GET", `/v1/drills/${encodeURIComponent(drillId)}/report`) };
        renderReport();
        return;
      } catch (err) {
        if (!(err instanceof ApiError && err.regionFailed)) {
          bannerForError(`report of ${drillId}`, err);
          return;
        }
      }
    }
  }

  // --- sources -------------------------------------------------------------------------------

  function drillTargetCutOff() {
    // a running region-loss or kill drill's target: its view is the cut-off side's
    for (const d of (state.drills && state.drills.drills) || []) {
      if (d.kind !== "evacuate" && FAULT_PHASES.has(d.phase)) return d.region;
    }
    return null;
  }

  function sourceCandidates() {
    const now = Date.now();
    const cutOff = drillTargetCutOff();
    const score = (r) => (now - (state.sourceFailedAt[r] || 0) < SOURCE_RETRY_MS ? 2 : 0) + (r === cutOff ? 1 : 0);
    return state.order.slice().sort((a, b) => score(a) - score(b) || state.order.indexOf(a) - state.order.indexOf(b));
  }

  async function readShared() {
    for (const region of sourceCandidates()) {
      try {
        const [regions, placement, drills, halt] = await Promise.all([
          api(region, "GET", "/v1/regions"),
          api(region, "GET", "/v1/placement"),
          api(region, "GET", `/v1/drills?limit=${DRILLS_LISTED}`),
          api(region, "GET", "/v1/admin/halt"),
        ]);
        Object.assign(state, { regions, placement, drills, halt, source: region, sharedAt: Date.now() });
        delete state.sourceError[region];
        await readAudit(region);
        await readPractice(region);
        await readActiveReport(region);
        await readReadiness(region);
        return;
      } catch (err) {
        if (!(err instanceof ApiError) || !err.regionFailed) {
          if (err instanceof ApiError && err.status === 401) return signOut("the key was refused (401)");
          state.sourceError[region] = err.message;
          return;
        }
        state.sourceFailedAt[region] = Date.now();
        state.sourceError[region] = `${err.status || ""} ${err.message}`.trim();
      }
    }
  }

  async function readAudit(region) {
    for (let page = 0; page < AUDIT_PAGES_PER_TICK; page++) {
      const body = await api(region, "GET", `/v1/audit?after=${state.auditAfter}&limit=${AUDIT_PAGE}`);
      if (!body.entries.length) return;
      state.audit.push(...body.entries);
      state.audit = state.audit.slice(-AUDIT_KEPT);
      state.auditAfter = body.next_after;
      if (body.entries.length < AUDIT_PAGE) return;
    }
  }

  async function readPractice(region) {
    try {
      const [calendar, overview] = await Promise.all([
        api(region, "GET", `/v1/practice/calendar?limit=${PRACTICE_LISTED}`),
        api(region, "GET", "/v1/practice"),
      ]);
      Object.assign(state, { practice: calendar, practiceOverview: overview });
    } catch (err) {
      // a node from before practice runs (a rolling upgrade) answers 404: the panel waits
      if (!(err instanceof ApiError) || err.regionFailed || err.status !== 404) throw err;
    }
  }

  async function readActiveReport(region) {
    const active = activeDrill();
    state.activeReport = active
      ? await api(region, "GET", `/v1/drills/${encodeURIComponent(active.drill_id)}/report`)
      : null;
  }

  async function readReadiness(region) {
    // the last evaluation (kept fresh by the control leader); a failure here never fails the
    // rest of the page: a node without readiness (an older release mid-upgrade) empties the
    // panel, any other failure leaves the last answer shown
    try {
      state.readiness = await api(region, "GET", "/v1/readiness");
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      if (err.status === 404) state.readiness = null; // else the last answer stays shown
    }
  }

  async function readNodes() {
    await Promise.all(state.order.map(async (region) => {
      const previous = state.nodes[region] || {};
      try {
        const body = await api(region, "GET", "/v1/console/node");
        state.nodes[region] = { body, at: Date.now(), error: null };
      } catch (err) {
        state.nodes[region] = { body: previous.body || null, at: previous.at || 0, error: err.message, status: err.status };
      }
    }));
  }

  function activeDrill() {
    return ((state.drills && state.drills.drills) || []).find((d) => !TERMINAL.has(d.phase)) || null;
  }

  // --- rendering -----------------------------------------------------------------------------

  function regionColor(name) {
    // by the cluster's order, so a region has the same colour on every region's page
    const i = state.names.indexOf(name);
    return REGION_COLORS[(i < 0 ? state.names.length : i) % REGION_COLORS.length];
  }

  function render() {
    renderTopbar();
    renderRegions();
    renderPlacement();
    renderReplay();
    renderDrill();
    renderHistory();
    renderAudit();
    renderReadiness();
    renderPractice();
  }

  function renderTopbar() {
    const source = state.source;
    let text = source ? `state from ${source}` : "no region has answered yet";
    if (source && source !== state.home) {
      const why = state.sourceError[state.home] ? `: ${state.sourceError[state.home]}` : drillTargetCutOff() === state.home ? ": it is the drill's target" : "";
      text += ` (this page's node ${state.home} not used${why})`;
    }
    $("source").textContent = text;
    const fresh = $("freshness");
    const age = Date.now() - state.sharedAt;
    fresh.textContent = state.sharedAt ? (age > STALE_AFTER_MS ? `STALE: no region answered for ${fmt.ago(state.sharedAt).replace(" ago", "")}` : `updated ${fmt.ago(state.sharedAt)}`) : "";
    fresh.className = `meta${state.sharedAt && age > STALE_AFTER_MS ? " stale" : ""}`;
    const halt = state.halt;
    const badge = $("halt-badge");
    if (halt && halt.on) {
      badge.textContent = `HALT ON: ${halt.reason} (${halt.by})`;
      badge.className = "badge halt-on";
    } else {
      badge.textContent = halt ? "halt off" : "";
      badge.className = "badge halt-off";
    }
    const toggle = $("halt-toggle");
    toggle.hidden = !halt;
    toggle.textContent = halt && halt.on ? "Lift halt" : "Halt drills";
    toggle.className = halt && halt.on ? "" : "danger";
    $("who").textContent = state.you ? `${state.you.tenant_id} (${state.you.role}${state.you.role === "viewer" ? ": read-only" : ""})` : "";
    $("signout").hidden = !state.key;
  }

  // Sections with buttons are rebuilt only when what they show changes structurally; numbers
  // that move every second are patched in place, so a button is never replaced under a click.
  const built = {};
  function rebuildIf(name, structure, build) {
    const signature = JSON.stringify(structure);
    if (built[name] === signature) return false;
    built[name] = signature;
    build();
    return true;
  }

  function patch(root, field, text, cls) {
    const el = root.querySelector(`[data-field="${field}"]`);
    if (!el) return;
    if (el.textContent !== text) el.textContent = text;
    if (cls !== undefined) el.className = cls;
  }

  function renderRegions() {
    const body = $("regions").tBodies[0];
    if (!state.regions) {
      rebuildIf("regions", null, () => fill(body, h("tr", {}, h("td", { colspan: 10, class: "muted" }, "waiting for a region to answer…"))));
      return;
    }
    $("regions-view").textContent = `as seen by ${state.regions.observer}`;
    const placement = state.placement || { down: [], evacuated: [], assignment: {} };
    const cutOff = drillTargetCutOff();
    const rows = state.regions.regions.map((r) => ({
      name: r.name,
      status: r.status,
      tags: [
        placement.down.includes(r.name) && r.status !== "down" ? "placement: down" : null,
        r.evacuated ? "evacuated" : null,
        r.name === (state.placement && state.placement.control_leader) ? "control leader" : null,
      ].filter(Boolean),
      target: r.name === cutOff,
    }));
    rebuildIf("regions", rows, () => fill(body, rows.map((row) =>
      h("tr", { class: `region-${row.status}`, "data-region": row.name, "data-status": row.status },
        h("td", {}, h("span", { class: "swatch", style: { background: regionColor(row.name) } }), h("b", {}, row.name)),
        h("td", {}, h("span", { class: `badge ${row.status}` }, row.status), " ",
          row.target ? h("span", { class: "badge tag drill" }, "drill target") : null,
          row.tags.map((t) => h("span", { class: "badge tag" }, t))),
        ["suspected", "shards", "appends", "errors", "acked", "replica", "reach"].map((f) =>
          h("td", { "data-field": f })),
        h("td", {},
          h("button", { type: "button", class: "small", "data-action": "evacuate", onclick: () => regionAction(row.name, "evacuate") }, "Evacuate"),
          h("button", { type: "button", class: "small", "data-action": "restore", onclick: () => regionAction(row.name, "restore") }, "Restore"))))));
    for (const r of state.regions.regions) {
      const tr = body.querySelector(`tr[data-region="${r.name}"]`);
      if (!tr) continue;
      const node = state.nodes[r.name] || {};
      const n = node.error ? null : node.body; // a region that stopped answering shows no old figures
      const appends = n ? n.appends : null;
      const errorRatio = appends ? appends.error_ratio : null;
      const loops = r.unhealthy_loops.length ? `; dead loops: ${r.unhealthy_loops.join(", ")}` : "";
      patch(tr, "suspected", r.suspected_by.length ? r.suspected_by.join(", ") : "nobody", r.suspected_by.length ? "bad" : "muted");
      patch(tr, "shards", `${r.shards_assigned} / ${n ? Object.keys(n.led_shards).length : "?"}`, "num");
      patch(tr, "appends", appends ? fmt.num(appends.received_per_s) : "–", "num");
      patch(tr, "errors", fmt.pct(errorRatio), `num${errorRatio ? " bad" : ""}`);
      patch(tr, "acked", appends ? fmt.num(appends.acked_led_per_s) : "–", "num");
      patch(tr, "replica", `${r.replica}${loops}`, r.replica === "quarantined" || loops ? "bad" : "muted");
      patch(tr, "reach", node.error ? `no answer${node.at ? ` since ${fmt.utc(node.at)}` : ""}` : node.at ? "answering" : "…",
        node.error ? "bad nowrap" : "muted");
      tr.querySelector('[data-field="reach"]').title = node.error || "";
    }
  }

  function leaders() {
    // shard -> {region, epoch} of the highest epoch any region says it leads at now
    const best = {};
    for (const [region, node] of Object.entries(state.nodes)) {
      if (!node.body || node.error) continue;
      for (const [shard, epoch] of Object.entries(node.body.led_shards)) {
        if (!best[shard] || epoch > best[shard].epoch) best[shard] = { region, epoch };
      }
    }
    return best;
  }

  function renderPlacement() {
    const p = state.placement;
    if (!p) return;
    const down = p.down.length ? `down: ${p.down.join(", ")}` : "none down";
    const evac = p.evacuated.length ? ` · evacuated: ${p.evacuated.join(", ")}` : "";
    $("placement-meta").textContent = `version ${p.version} · ${p.reason} · control leader ${p.control_leader} · ${down}${evac}`;
    const lead = leaders();
    const shards = Object.keys(p.assignment).map(Number).sort((a, b) => a - b);
    let unled = 0;
    fill($("grid"), shards.map((shard) => {
      const placed = p.assignment[String(shard)];
      const leader = lead[String(shard)];
      const serving = leader && leader.region === placed;
      if (!serving) unled++;
      const epoch = leader ? `e${leader.epoch}` : "e –";
      const title = `shard ${shard}: placed on ${placed}; ` +
        (leader ? `led by ${leader.region} at epoch ${leader.epoch}` : "no region reports leading it now");
      return h("div", { class: `cell${serving ? "" : " unled"}`, style: { backgroundColor: regionColor(placed) }, title, "data-shard": shard, "data-region": placed },
        h("div", { class: "shard" }, shard), h("div", { class: "epoch" }, epoch, leader && !serving ? ` @${leader.region}` : ""));
    }));
    $("grid").style.gridTemplateColumns = `repeat(${Math.min(16, Math.max(8, Math.ceil(Math.sqrt(shards.length * 4))))}, minmax(0, 1fr))`;
    const counts = {};
    for (const r of Object.values(p.assignment)) counts[r] = (counts[r] || 0) + 1;
    fill($("legend"),
      state.names.map((r) => h("span", {}, h("span", { class: "swatch", style: { background: regionColor(r) } }), `${r}: ${counts[r] || 0} shards`)),
      h("span", {}, h("span", { class: "swatch unled" }), `not led by its region now: ${unled}`),
      h("span", {}, "cell: shard number, epoch of its leader"));
  }

  function renderReplay() {
    fill($("replay").tBodies[0], state.names.map((region) => {
      const node = state.nodes[region] || {};
      const r = node.body ? node.body.replay : null;
      const name = h("td", {}, h("span", { class: "swatch", style: { background: regionColor(region) } }), region);
      if (!node.body || node.error) return h("tr", {}, name, h("td", { colspan: 10, class: node.error ? "bad" : "muted" }, node.error ? `no answer from ${region}: ${node.error}` : "…"));
      if (!r) return h("tr", {}, name, h("td", { colspan: 10, class: "muted" }, "replay does not run on this node"));
      return h("tr", { "data-region": region },
        name,
        h("td", { class: "num" }, fmt.num(r.queued, 0)),
        h("td", { class: "num" }, fmt.num(r.queued_tokens, 0)),
        h("td", { class: "num" }, fmt.num(r.running, 0)),
        h("td", { class: "num" }, fmt.num(r.done, 0)),
        h("td", { class: "num" }, fmt.num(r.done_tokens, 0)),
        h("td", { class: "num" }, fmt.num(r.replayed_tokens_per_s, 0)),
        r.engines === 0
          ? h("td", { class: "muted", title: "no inference engine is attached to this region's replay" }, "no engine")
          : h("td", { class: `num${r.spare_tokens_per_s <= 0 && r.queued > 0 ? " bad" : ""}` }, fmt.num(r.spare_tokens_per_s, 0)),
        h("td", { class: "num" }, fmt.num(r.live_tokens_per_s, 0)),
        h("td", { class: r.engines_unknown ? "bad" : "num" }, `${r.engines}${r.engines_unknown ? ` (${r.engines_unknown} unknown)` : ""}`),
        notReplayable(r.not_replayed));
    }));
  }

  function renderReadiness() {
    const body = state.readiness;
    $("readiness-meta").textContent = body
      ? `plane ${body.status.replace("_", " ")} (score ${body.score}), evaluated ${fmt.ago(body.evaluated_at_ms)}`
      : "";
    fill($("readiness").tBodies[0], (body ? body.regions : []).map((r) => h("tr", { "data-region": r.region, "data-status": r.status, "data-score": r.score },
      h("td", {}, h("span", { class: "swatch", style: { background: regionColor(r.region) } }), r.region),
      h("td", {}, h("span", { class: `badge ${r.status.replace("_", "-")}` }, r.status.replace("_", " "))),
      h("td", { class: "num" }, String(r.score)),
      h("td", { class: "num", title: "lower bound on replaying the moved conversations on the survivors' spare prefill" },
        r.replay_time_min_s === null ? "–" : `${fmt.num(r.replay_time_min_s, 1)} s`),
      h("td", {}, r.last_passed_drill ? `${fmt.utcDate(r.last_passed_drill.ended_at_ms)} (${r.last_passed_drill.kind})` : "never"),
      h("td", { class: r.reasons.length ? "" : "muted" }, r.reasons.join("; ") || "–"))));
  }

  function notReplayable(n) {
    if (!n) return h("td", { class: "muted" }, "-");
    const total = (n.no_engine || 0) + (n.model_unserved || 0);
    const revisions = Object.entries(n.unserved_model_revisions || {}).map(([rev, count]) => `${rev}: ${count}`);
    const why = [n.no_engine ? `${n.no_engine} with no engine in the region` : null,
                 n.model_unserved ? `${n.model_unserved} pinned to a revision no engine serves (${revisions.join(", ")})` : null]
      .filter(Boolean).join("; ");
    return h("td", { class: total > 0 ? "num bad" : "num", title: why || "every moved conversation can be replayed here" }, fmt.num(total, 0));
  }

  function seriesChart(series) {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("class", "series");
    svg.setAttribute("viewBox", "0 0 400 70");
    svg.setAttribute("preserveAspectRatio", "none");
    if (!series || series.length < 2) return svg;
    const maxT = Math.max(...series.map((p) => p.t_s), 1);
    const maxV = Math.max(...series.map((p) => Math.max(p.acked, p.errors)), 1);
    for (const key of ["acked", "errors"]) {
      const path = document.createElementNS(ns, "polyline");
      path.setAttribute("class", key);
      path.setAttribute("points", series.map((p) => `${(p.t_s / maxT) * 396 + 2},${66 - (p[key] / maxV) * 58}`).join(" "));
      svg.append(path);
    }
    return svg;
  }

  function seriesBlock(series) {
    const points = series || [];
    const maxV = Math.max(0, ...points.map((p) => Math.max(p.acked, p.errors)));
    const last = points.length ? points[points.length - 1] : null;
    return h("div", {},
      h("div", { class: "series-caption" }, "canary writes per second: ",
        h("span", { class: "acked" }, "acked"), " and ", h("span", { class: "errors" }, "errors"),
        points.length ? ` · ${points.length} s shown, peak ${maxV}/s` : " · no points yet",
        last ? ` · last ${last.acked} acked, ${last.errors} errors, ack p99 ${fmt.num(last.ack_p99_ms, 0)} ms` : ""),
      seriesChart(points));
  }

  function renderDrill() {
    const el = $("drill");
    const drill = activeDrill();
    if (!drill) {
      const last = ((state.drills && state.drills.drills) || [])[0];
      rebuildIf("drill", last ? [last.drill_id, last.phase] : null, () => fill(el, h("p", { class: "none" }, "No drill is running.",
        last ? ` Last: ${last.kind} of ${last.region}, ${last.verdict || last.phase}${last.ended_at ? ` at ${fmt.utc(last.ended_at)} UTC` : ""}.` : "")));
      return;
    }
    const tripped = drill.guards_tripped || [];
    const index = PHASES.indexOf(drill.phase);
    rebuildIf("drill", [drill.drill_id, drill.phase, drill.timeline.length, tripped.length], () => {
      const fact = (k, field) => h("div", { class: "fact" }, h("div", { class: "k" }, k), h("div", { class: "v", "data-field": field }));
      fill(el,
        h("div", { class: "title", "data-drill": drill.drill_id, "data-phase": drill.phase },
          h("span", {}, `${drill.kind} of ${drill.region}`),
          h("span", { class: "badge running" }, drill.phase),
          h("span", { class: "muted mono" }, drill.drill_id),
          h("span", { class: "spacer" }),
          h("button", { type: "button", class: "danger", id: "abort-drill", onclick: () => abortDrill(drill) }, "Abort drill")),
        h("div", { class: "muted" }, `by ${drill.requested_by || "?"}: “${drill.reason || ""}” · hold ${drill.hold_s} s · guards: RTO ≤ ${drill.guards.max_rto_s} s, errors ≤ ${fmt.pct(drill.guards.max_error_ratio)}, ack p99 ≤ ${drill.guards.max_ack_p99_ms} ms`),
        h("div", { class: "stepper" }, PHASES.map((p, i) => h("div", { class: `step${i < index ? " past" : ""}${i === index ? " current" : ""}` }, p))),
        h("div", { class: "facts" },
          fact(drill.injected_at ? "since injection" : "since start", "elapsed"),
          fact("shards moved / recovered", "shards"),
          fact("RTO max so far", "rto"),
          fact("canaries acked / errors", "canaries")),
        tripped.length ? h("div", { class: "banner error" }, tripped.map((g) => `guard tripped: ${g.guard} ${fmt.num(g.measured, 3)} > ${fmt.num(g.limit, 3)}`).join("; ")) : null,
        h("div", { id: "drill-series" }),
        h("div", { class: "timeline" }, h("table", {}, h("tbody", {}, drill.timeline.slice().reverse().map((t) =>
          h("tr", {}, h("td", { class: "mono" }, fmt.utc(t.at_ms)), h("td", {}, h("b", {}, t.phase)), h("td", {}, t.note)))))));
    });
    const started = drill.injected_at || drill.started_at;
    patch(el, "elapsed", started ? `${((Date.now() - Date.parse(started)) / 1000).toFixed(0)} s` : "–");
    patch(el, "shards", `${drill.shards_moved} / ${drill.shards_recovered}`, `v${drill.shards_recovered < drill.shards_moved ? " bad" : ""}`);
    patch(el, "rto", fmt.secs(drill.rto_max_s), `v${drill.rto_max_s !== null && drill.rto_max_s > drill.guards.max_rto_s ? " bad" : ""}`);
    patch(el, "canaries", `${drill.canary_acked} / ${drill.canary_errors}`, `v${drill.canary_errors > 0 ? " bad" : ""}`);
    const report = state.activeReport && state.activeReport.drill_id === drill.drill_id ? state.activeReport : null;
    fill($("drill-series"), seriesBlock(report ? report.series : null));
  }

  function verdictBadge(d) {
    const v = d.verdict || d.phase;
    const cls = { passed: "passed", done: "done", aborted: "aborted", failed: "failed" }[v] || "running";
    return h("span", { class: `badge ${cls}`, title: d.verdict_reason || d.abort_reason || "" }, v);
  }

  function renderHistory() {
    const drills = ((state.drills && state.drills.drills) || []).filter((d) => TERMINAL.has(d.phase));
    rebuildIf("history", drills.map((d) => [d.drill_id, d.phase, d.canary_lost]), () => fill($("drills").tBodies[0], drills.length ? drills.map((d) =>
      h("tr", { "data-drill": d.drill_id },
        h("td", { class: "mono" }, fmt.utcDate(d.started_at)),
        h("td", {}, d.kind), h("td", {}, d.region), h("td", {}, verdictBadge(d)),
        h("td", { class: `num${d.rto_max_s !== null && d.rto_max_s > d.guards.max_rto_s ? " bad" : ""}` }, fmt.secs(d.rto_max_s)),
        h("td", { class: `num${d.canary_lost ? " bad" : ""}` }, `${d.canary_acked} / ${d.canary_lost === null ? "–" : d.canary_lost}`),
        h("td", {}, h("button", { type: "button", class: "small", onclick: () => showReport(d.drill_id) }, "Report")))) :
      h("tr", {}, h("td", { colspan: 7, class: "muted" }, "no finished drill yet"))));
  }

  function renderReport() {
    const open = state.openReport;
    if (!open) return fill($("report"));
    const r = open.body;
    if (!r) return fill($("report"), h("div", { class: "box muted" }, `loading report of ${open.drill_id}…`));
    fill($("report"), h("div", { class: "box", "data-report": r.drill_id },
      h("div", {}, h("b", {}, `${r.kind} of ${r.region}`), " ", verdictBadge(r), " ", h("span", { class: "muted" }, r.verdict_reason || "")),
      h("div", {}, `RTO p50 ${fmt.secs(r.rto_p50_s)} · p99 ${fmt.secs(r.rto_p99_s)} · max ${fmt.secs(r.rto_max_s)} · shards moved ${r.shards_moved}, recovered ${r.shards_recovered}`),
      h("div", {}, `canary events acked ${r.canary_acked}, errors ${r.canary_errors}, lost ${r.canary_lost === null ? "–" : r.canary_lost}`),
      (r.guards_tripped || []).map((g) => h("div", { class: "bad" }, `guard tripped: ${g.guard} ${fmt.num(g.measured, 3)} > ${fmt.num(g.limit, 3)}`)),
      r.abort_reason && !(r.verdict_reason || "").includes(r.abort_reason) ? h("div", {}, `aborted: ${r.abort_reason}`) : null,
      h("div", { class: "muted" }, `by ${r.requested_by}: “${r.reason}”; ${fmt.utcDate(r.started_at)} → ${fmt.utcDate(r.ended_at)} UTC`),
      seriesBlock(r.series),
      h("div", {},
        h("button", { type: "button", class: "small", onclick: () => downloadReport(r.drill_id) }, "Download HTML report"), " ",
        h("button", { type: "button", class: "small", onclick: () => { state.openReport = null; renderReport(); } }, "Close"))));
  }

  function renderAudit() {
    rebuildIf("audit", [state.audit.length, state.auditAfter], () => fill($("audit").tBodies[0], state.audit.length ? state.audit.slice().reverse().map((e) =>
      h("tr", { "data-action": e.action },
        h("td", { class: "mono" }, fmt.utcDate(e.at_ms).slice(5)),
        h("td", {}, `${e.by} (${e.role})`),
        h("td", {}, h("b", {}, e.action)),
        h("td", {}, e.target),
        h("td", {}, e.reason))) :
      h("tr", {}, h("td", { colspan: 5, class: "muted" }, "no operator action recorded yet"))));
  }

  function renderPractice() {
    const entries = (state.practice && state.practice.entries) || [];
    rebuildIf("practice", entries.map((e) => e.cursor), () => fill($("practice").tBodies[0], entries.length ? entries.map((e) =>
      h("tr", { "data-outcome": e.outcome },
        h("td", { class: "mono" }, fmt.utcDate(e.at_ms).slice(5)),
        h("td", {}, e.schedule_id || e.run_id),
        h("td", {}, h("b", {}, e.outcome)),
        h("td", { class: "mono" }, e.drill_id || "–"),
        h("td", {}, e.reason))) :
      h("tr", {}, h("td", { colspan: 5, class: "muted" }, "no practice run decided yet"))));
    const overview = state.practiceOverview || { runs: [], schedules: [] };
    const waiting = overview.runs.filter((r) => r.status === "awaiting_approval");
    rebuildIf("practice-approvals", waiting, () => fill($("practice-approvals").tBodies[0], waiting.length ? waiting.map((r) =>
      h("tr", { "data-run": r.run_id },
        h("td", { class: "mono" }, fmt.utcDate(r.requested_at_ms).slice(5)),
        h("td", { class: "mono" }, r.run_id),
        h("td", {}, `${r.kind} of ${r.region}, hold ${r.hold_s} s`),
        h("td", {}, r.requested_by),
        h("td", {}, r.reason),
        h("td", {}, h("button", { type: "button", class: "small", "data-action": "approve", onclick: () => approveRun(r) }, "Approve")))) :
      h("tr", {}, h("td", { colspan: 6, class: "muted" }, "no run waits for approval"))));
    const schedules = overview.schedules;
    rebuildIf("practice-schedules", schedules, () => fill($("practice-schedules").tBodies[0], schedules.length ? schedules.map((sc) =>
      h("tr", { "data-schedule": sc.schedule_id },
        h("td", {}, h("b", {}, sc.schedule_id), sc.enabled ? null : h("span", { class: "badge tag" }, "disabled"),
          sc.needs_approval ? h("span", { class: "badge tag" }, "needs approval") : null,
          sc.chance < 1 ? h("span", { class: "badge tag" }, `chance ${Math.round(sc.chance * 100)} %`) : null),
        h("td", {}, `${sc.kind} of ${sc.region}`),
        h("td", {}, sc.windows.join(", ")),
        h("td", { class: "num" }, `${sc.hold_s} s`),
        h("td", { class: "num" }, `${+(sc.min_interval_s / 3600).toFixed(2)} h`),
        h("td", {}, sc.by),
        h("td", { class: "nowrap" },
          h("button", { type: "button", class: "small", "data-action": "edit", onclick: () => editSchedule(sc) }, "Edit"),
          h("button", { type: "button", class: "small", "data-action": "delete", onclick: () => deleteSchedule(sc) }, "Delete")))) :
      h("tr", {}, h("td", { colspan: 7, class: "muted" }, "no schedule"))));
    const names = regionNames();
    rebuildIf("schedule-regions", names, () => {
      const select = $("schedule-region");
      const chosen = select.value;
      fill(select, names.map((n) => h("option", {}, n)));
      if (names.includes(chosen)) select.value = chosen;
      fill($("scope-regions"), checkboxes("scope-regions", names, ticked("scope-regions")));
      fill($("scope-kinds"), checkboxes("scope-kinds", KINDS, ticked("scope-kinds")));
    });
    // the policy's boxes show what the control shard holds (rebuilt when that changes)
    const policy = overview.approval_policy || { regions: [], kinds: [] };
    rebuildIf("policy", [names, policy], () => {
      fill($("policy-regions"), checkboxes("policy-regions", names, policy.regions));
      fill($("policy-kinds"), checkboxes("policy-kinds", KINDS, policy.kinds));
    });
    const needs = [...(policy.regions || []), ...(policy.kinds || [])];
    $("policy-now").textContent = needs.length ? `now: ${needs.join(", ")}` : "now: none";
    const scopes = Object.entries(overview.scopes || {});
    rebuildIf("practice-scopes", scopes, () => fill($("practice-scopes").tBodies[0], scopes.length ? scopes.map(([key, sc]) =>
      h("tr", { "data-key": key },
        h("td", {}, h("b", {}, key)),
        h("td", {}, sc.regions === null ? "any" : sc.regions.join(", ") || "none"),
        h("td", {}, sc.kinds === null ? "any" : sc.kinds.join(", ") || "none"),
        h("td", {}, h("button", { type: "button", class: "small", "data-action": "edit-scope", onclick: () => editScope(key, sc) }, "Edit")))) :
      h("tr", {}, h("td", { colspan: 4, class: "muted" }, "no key has a blast radius: every operator key may drill anything"))));
  }

  // --- the loop ------------------------------------------------------------------------------

  let ticking = false;
  async function tick(now) {
    if (ticking) return;
    ticking = true;
    clearTimeout(state.timer);
    try {
      await Promise.all([readNodes(), readShared()]);
      if (state.key) render();
    } finally {
      ticking = false;
      if (state.key) state.timer = setTimeout(tick, now ? POLL_MS / 2 : POLL_MS);
    }
  }

  async function signIn() {
    let node;
    try {
      node = await api(null, "GET", "/v1/console/node");
    } catch (err) {
      if (err.status === 0) {
        // this page's node does not answer: use the regions remembered from earlier
        const saved = JSON.parse(sessionStorage.getItem(URLS_ITEM) || "null");
        if (saved) return startWith(saved.home, saved.urls, null);
      }
      const why = err.status === 403
        ? "403 forbidden: this is a tenant key; the console needs an operator or viewer key"
        : err.status === 401 ? "401: unknown key" : `sign-in failed: ${err.message}`;
      return signOut(why);
    }
    startWith(node.region, node.browser_urls, node.you);
    showDashboardLink(node.dashboard_url);
  }

  function showDashboardLink(url) {
    const link = $("dashboard-link");
    // only a plain http(s) URL from the node's own settings becomes a link
    const ok = typeof url === "string" && /^https?:\/\/\S+$/.test(url);
    link.hidden = !ok;
    if (ok) link.href = url; else link.removeAttribute("href");
  }

  function startWith(home, urls, you) {
    state.home = home;
    state.urls = { ...urls, [home]: "" };
    state.names = Object.keys(urls);
    state.order = [home, ...state.names.filter((r) => r !== home)];
    state.you = you;
    sessionStorage.setItem(URLS_ITEM, JSON.stringify({ home, urls }));
    $("login").hidden = true;
    $("main").hidden = false;
    renderTopbar();
    tick(false);
  }

  function signOut(why) {
    sessionStorage.removeItem(KEY_ITEM);
    showDashboardLink(null);
    clearTimeout(state.timer);
    Object.assign(state, { key: null, you: null, regions: null, placement: null, drills: null, halt: null, practice: null, practiceOverview: null, nodes: {}, audit: [], auditAfter: 0, sharedAt: 0, source: null });
    for (const name of Object.keys(built)) delete built[name];
    $("main").hidden = true;
    $("login").hidden = false;
    $("key").value = "";
    renderTopbar();
    if (why) banner("forbidden", why);
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const key = $("key").value.trim();
      if (!key) return;
      state.key = key;
      sessionStorage.setItem(KEY_ITEM, key);
      $("key").value = "";
      state.banners = [];
      renderBanners();
      signIn();
    });
    $("signout").addEventListener("click", () => signOut(null));
    $("halt-toggle").addEventListener("click", toggleHalt);
    $("schedule-form").addEventListener("submit", saveSchedule);
    $("policy-form").addEventListener("submit", savePolicy);
    $("scope-form").addEventListener("submit", saveScope);
    if (state.key) signIn();
    else $("login").hidden = false;
    // ages ("3 s ago") move between polls too
    setInterval(() => { if (state.key && state.sharedAt) renderTopbar(); }, 500);
  });
})();
