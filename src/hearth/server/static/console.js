// The hearth console: renders a conversation's records for people and follows them live.
// No build step and no libraries: the page talks to the same JSON and SSE API as any client.
(function () {
  "use strict";

  const pad = (n) => String(n).padStart(2, "0");
  function clock(unix) {
    const d = new Date(unix * 1000);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }
  for (const t of document.querySelectorAll("time[data-unix]")) {
    t.textContent = clock(Number(t.dataset.unix));
  }

  const page = document.getElementById("console");
  if (!page) return;

  const root = page.dataset.root;
  const agent = page.dataset.agent;
  const convId = page.dataset.id;
  const conversationId = `${agent}/${convId}`;
  const api = `${root}/agents/${encodeURIComponent(agent)}/${encodeURIComponent(convId)}`;
  const PAGE = 200; // records per page when opening and when paging backwards
  const ADVISORIES = new Set(["stream_interrupted", "submission_interrupted", "submission_aborted"]);

  const timeline = document.getElementById("timeline");
  const earlier = document.getElementById("earlier");
  const liveState = document.getElementById("live-state");
  const lastOffsetText = document.getElementById("last-offset");
  const result = document.getElementById("action-result");
  const refreshNote = document.getElementById("refresh-note");

  let last = Number(page.dataset.lastOffset); // the newest offset shown (or -1)
  let first = last + 1; // the oldest offset shown
  const live = { into: timeline, messages: new Map(), calls: new Map(), prepend: false };
  const markers = new Map(); // "submission:attempt" → its boundary element
  const taken = []; // every offset taken from the stream, in order (the tests read it)
  // (What the browser tests look at: the offsets taken, and how many refreshes completed.)
  window.hearthConsole = { offsets: taken, refreshes: 0 };

  // --- small DOM helpers ------------------------------------------------------------------
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function show(value) {
    if (typeof value === "string") return value;
    return JSON.stringify(value);
  }
  function short(value, n) {
    const s = show(value);
    return s.length > n ? s.slice(0, n - 1) + "…" : s;
  }
  function consoleLink(childId) {
    const a = el("a", null, childId);
    a.href = `${root}/console/${childId}`;
    return a;
  }

  function entry(rec, title, cls) {
    const li = el("li", `rec rec-${rec.type}${cls ? " " + cls : ""}`);
    li.dataset.offset = rec.offset;
    li.dataset.type = rec.type;
    const meta = el("div", "meta");
    meta.append(el("span", "title", title), el("span", "offset", `#${rec.offset}`));
    if (rec.at) meta.append(el("span", "at", rec.at.replace("T", " ").replace("Z", "")));
    li.append(meta);
    return li;
  }
  function body(li, text, cls) {
    const b = el("div", cls || "body", text);
    li.append(b);
    return b;
  }
  function recovery(li, note) {
    li.classList.add("recovery");
    li.querySelector(".meta").append(el("span", "badge", note));
  }

  // A message's text, then its attachments: raster images inline, other files as links. Records
  // hold references only; the bytes come from GET /attachments/{sha256}.
  const INLINE_IMAGES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
  function userContent(li, content) {
    if (!Array.isArray(content)) {
      body(li, show(content), "text");
      return;
    }
    const files = [];
    for (const part of content) {
      if (part && part.type === "attachment" && typeof part.sha256 === "string") files.push(part);
      else if (part && part.type === "text") body(li, part.text, "text");
      else body(li, show(part), "text");
    }
    if (!files.length) return;
    const box = el("div", "attachments");
    for (const f of files) {
      const url = `${root}/attachments/${encodeURIComponent(f.sha256)}`;
      const item = el("div", "attachment");
      item.dataset.sha256 = f.sha256;
      const link = el("a", null, INLINE_IMAGES.has(f.media_type) ? null : f.name);
      link.href = url;
      link.download = f.name;
      if (INLINE_IMAGES.has(f.media_type)) {
        const img = el("img");
        img.src = url;
        img.alt = f.name;
        img.loading = "lazy";
        link.append(img);
        link.removeAttribute("download");
        link.target = "_blank";
      }
      item.append(link, el("span", "file-meta", `${f.name} · ${f.media_type} · ${size(f.size)}`));
      box.append(item);
    }
    li.append(box);
  }
  function size(n) {
    if (n >= 1048576) return `${(n / 1048576).toFixed(1)} MiB`;
    if (n >= 1024) return `${(n / 1024).toFixed(1)} KiB`;
    return `${n} bytes`;
  }

  // --- one record → its place in the timeline -----------------------------------------------
  // The attempts that follow a durable wait's end (`submission:attempt`): an attempt that a
  // wait ended was not cut off, and the one after it is no recovery.
  const afterWait = new Set();
  function boundary(rec, ctx, before) {
    if (!rec.submission_id || !rec.attempt) return;
    const key = `${rec.submission_id}:${rec.attempt}`;
    if (ctx.seen && ctx.seen.has(key)) return;
    if (ctx.seen) ctx.seen.add(key);
    const old = markers.get(key);
    if (old && !ctx.prepend) return;
    if (old) old.remove(); // paging backwards found where this attempt really starts
    const resumed = afterWait.has(key);
    const recovered = rec.attempt > 1 && !resumed;
    const li = el("li", "attempt-boundary" + (recovered ? " recovery" : ""));
    li.dataset.submission = rec.submission_id;
    li.dataset.attempt = rec.attempt;
    li.textContent = resumed
      ? `attempt ${rec.attempt} of ${rec.submission_id}: resumed after its wait ended`
      : recovered
        ? `attempt ${rec.attempt} of ${rec.submission_id}: recovered after attempt ${rec.attempt - 1} was cut off`
        : `attempt 1 of ${rec.submission_id}`;
    markers.set(key, li);
    before.push(li);
  }

  // A call or a message whose end is on another page than its start (or arrives later) is
  // joined to it across pages: the calls and message starts shown, by id, and their ends seen.
  const shownCalls = new Map(); // tool_call_id → [{ offset, li, status, ended }]
  const callEnds = new Map(); // tool_call_id → [{ offset, interrupted, text }]
  const shownStarts = new Map(); // message_id → { li, text }
  const continuations = new Map(); // message_id → its "assistant (continued)" entries, one a page
  const completions = new Map(); // message_id → its assistant_message_completed record
  function listed(map, key, item) {
    if (!map.has(key)) map.set(key, []);
    map.get(key).push(item);
  }
  function endCall(call, end) {
    call.status.textContent = end.text;
    call.ended = true;
    if (end.interrupted) call.li.classList.add("interrupted", "recovery");
  }
  // The open call with this id just before ``offset`` (an id may come again in a later turn).
  function openCallBefore(id, offset) {
    const open = (shownCalls.get(id) || []).filter((c) => !c.ended && c.offset < offset);
    return open.sort((a, b) => b.offset - a.offset)[0];
  }
  // A message shown as started (on an earlier page) whose completion is known: its entry gets
  // the whole text, and the "(continued)" entry of a later page goes.
  function finishMessage(id) {
    const done = completions.get(id);
    const start = shownStarts.get(id);
    if (!done || !start || !start.li.classList.contains("streaming")) return;
    start.li.classList.remove("streaming");
    if (done.text) start.text.textContent = done.text;
    start.li.dataset.stopReason = done.stop_reason;
    if (done.stop_reason === "aborted") recovery(start.li, "aborted partial output");
    for (const continued of continuations.get(id) || []) {
      if (continued !== start.li) continued.remove();
    }
    continuations.delete(id);
  }
  // After a page of earlier records: its calls and messages that end on a later page.
  function joinLater(ctx) {
    for (const call of ctx.calls.values()) {
      if (call.ended) continue;
      const ends = (callEnds.get(call.id) || []).filter((e) => e.offset > call.offset);
      const end = ends.sort((a, b) => a.offset - b.offset)[0];
      if (end) endCall(call, end);
    }
    for (const id of ctx.messages.keys()) finishMessage(id);
  }

  // ``ctx`` is ``live`` for records taken from the stream, or a page of earlier records being
  // prepended: each looks up messages and calls among its own first, as they come before it.
  function render(rec, ctx) {
    const out = [];
    boundary(rec, ctx, out);
    let li = null;
    switch (rec.type) {
      case "conversation_created":
        li = entry(rec, "conversation created", "system");
        body(li, `agent ${rec.agent}`);
        if (rec.parent) {
          const p = body(li, "child task of ");
          p.append(consoleLink(rec.parent.conversation_id));
        }
        break;
      case "user_message":
        li = entry(rec, "user", "user");
        userContent(li, rec.content);
        break;
      case "signal":
        li = entry(rec, `signal · ${rec.signal_type}`, "signal");
        if (rec.body) body(li, rec.body, "text");
        if (rec.attributes && Object.keys(rec.attributes).length) body(li, show(rec.attributes), "data");
        if (ADVISORIES.has(rec.signal_type)) recovery(li, "advisory");
        break;
      case "assistant_message_started": {
        li = entry(rec, `assistant · ${rec.model}`, "assistant");
        const text = body(li, "", "text");
        ctx.messages.set(rec.message_id, { li, text });
        shownStarts.set(rec.message_id, { li, text });
        li.classList.add("streaming");
        break;
      }
      case "assistant_text_delta": {
        let m = ctx.messages.get(rec.message_id);
        if (!m) { // its start is on an earlier page
          li = entry(rec, "assistant (continued)", "assistant streaming");
          m = { li, text: body(li, "", "text") };
          ctx.messages.set(rec.message_id, m);
          listed(continuations, rec.message_id, li);
        }
        m.text.textContent += rec.delta;
        m.li.dataset.lastOffset = rec.offset;
        break;
      }
      case "assistant_tool_call": {
        li = entry(rec, `tool call · ${rec.name}`, "tool-call");
        body(li, short(rec.arguments, 300), "data");
        const status = body(li, "running…", "status");
        const call = { id: rec.tool_call_id, offset: rec.offset, li, status, ended: false };
        ctx.calls.set(rec.tool_call_id, call);
        listed(shownCalls, rec.tool_call_id, call);
        break;
      }
      case "assistant_message_completed": {
        const m = ctx.messages.get(rec.message_id);
        if (m) {
          m.li.classList.remove("streaming");
          m.text.textContent = rec.text || "";
          m.li.dataset.stopReason = rec.stop_reason;
          if (rec.stop_reason === "aborted") recovery(m.li, "aborted partial output");
        }
        li = entry(rec, `assistant message ended · ${rec.stop_reason}`, "assistant-end");
        if (!m && rec.text) body(li, rec.text, "text");
        if (rec.usage && Object.keys(rec.usage).length) body(li, short(rec.usage, 200), "data");
        if (rec.error) body(li, show(rec.error), "error");
        if (rec.stop_reason === "aborted") {
          recovery(li, "cut off");
          body(li, "the stream was cut off; the text above is what was persisted", "note");
        }
        completions.set(rec.message_id, rec);
        if (!ctx.prepend) finishMessage(rec.message_id); // (a page's are joined once it is in)
        break;
      }
      case "tool_outcome": {
        const interrupted = rec.is_error && rec.content && rec.content.type === "interrupted";
        li = entry(rec, `tool outcome · ${rec.name}`, rec.is_error ? "tool-outcome error" : "tool-outcome");
        body(li, short(rec.content, 600), "data");
        const took = `${rec.duration_ms} ms` + (rec.reconciled ? ` · reconciled ${rec.reconciled}` : "");
        body(li, took, "duration");
        if (interrupted) {
          li.classList.add("interrupted");
          recovery(li, "interrupted");
        }
        const end = {
          offset: rec.offset,
          interrupted,
          text: interrupted ? "interrupted" : rec.is_error ? "error" : `done in ${rec.duration_ms} ms`,
        };
        listed(callEnds, rec.tool_call_id, end);
        const own = ctx.calls.get(rec.tool_call_id);
        const call = own && !own.ended ? own : openCallBefore(rec.tool_call_id, rec.offset);
        if (call) endCall(call, end);
        break;
      }
      case "tool_results_committed":
        li = entry(rec, `tool results committed (${rec.tool_call_ids.length})`, "system minor");
        break;
      case "tool_step_settled":
        // hearth's bookkeeping of state writes: the state shows where it commits
        if (rec.step === "hearth.state_writes" || rec.step.startsWith("hearth.sets:")) break;
        li = entry(rec, `step · ${rec.step}`, "step");
        body(li, short(rec.value, 300), "data");
        break;
      case "state_write":
        li = entry(rec, `state · ${rec.name}`, "state");
        body(li, short(rec.value, 300), "data");
        break;
      case "hook_seam_committed":
        li = entry(rec, `hook seam · ${rec.hook}`, "system minor");
        break;
      case "child_conversation_linked": {
        li = entry(rec, "child task", "child");
        const p = body(li, "runs in ");
        p.append(consoleLink(rec.child_conversation_id));
        break;
      }
      case "compaction":
        li = entry(rec, "compaction", "compaction");
        body(li, rec.summary, "text");
        body(li, `${rec.tokens_before} tokens before; kept from #${rec.first_kept_offset}`, "note");
        break;
      case "submission_settled":
        li = entry(rec, `settled · ${rec.outcome}`, `settled outcome-${rec.outcome}`);
        if (rec.reply) body(li, rec.reply, "text");
        if (rec.error) {
          body(li, `${rec.error.type}: ${rec.error.message}`, "error");
          for (const t of rec.error.interrupted_tools || []) {
            const b = body(li, `interrupted: ${t.name} (${t.tool_call_id})`, "note");
            if (t.child_conversation_id) { b.append(" → "); b.append(consoleLink(t.child_conversation_id)); }
          }
        }
        break;
      case "wait_started":
        li = entry(rec, `waiting · ${rec.name}`, "wait");
        if (rec.prompt) body(li, show(rec.prompt), "text");
        break;
      case "wait_resolved":
        li = entry(rec, rec.aborted ? "wait ended: aborted" : rec.timed_out ? "wait timed out" : "wait resolved", "wait");
        if (rec.value !== undefined && !rec.aborted) body(li, short(rec.value, 300), "data");
        if (rec.submission_id) afterWait.add(`${rec.submission_id}:${(rec.attempt || 0) + 1}`);
        break;
      default:
        li = entry(rec, rec.type, "system");
        body(li, short(rec, 400), "data");
    }
    if (li) out.push(li);
    return out;
  }

  // --- loading and following ---------------------------------------------------------------
  function take(rec) {
    if (rec.offset <= last) return; // seen already: a resumed stream never shows it twice
    if (page.dataset.exists !== "yes") { // its first record, sent from elsewhere
      page.dataset.exists = "yes";
      document.getElementById("no-records")?.remove();
    }
    for (const li of render(rec, live)) timeline.append(li);
    taken.push(rec.offset);
    last = rec.offset;
    lastOffsetText.textContent = String(last);
    if (["user_message", "submission_settled", "assistant_message_started", "signal"].includes(rec.type)) {
      soon();
    }
  }

  async function getJSON(url) {
    const r = await fetch(url, { credentials: "same-origin", headers: { accept: "application/json" } });
    if (r.status === 401) throw new Error("signed out: reload the page to sign in again");
    const data = await r.json();
    if (!r.ok) throw new Error(data.error ? data.error.message : `HTTP ${r.status}`);
    return data;
  }

  async function openNewest() {
    if (last < 0) return;
    const from = Math.max(-1, last - PAGE);
    const data = await getJSON(`${api}/stream?offset=${from}&limit=${PAGE}`);
    first = from + 1;
    last = from;
    for (const rec of data.records) take(rec);
    earlier.hidden = first <= 0;
  }

  async function loadEarlier() {
    if (first <= 0) return;
    const from = Math.max(-1, first - 1 - PAGE);
    // A JSON page ends early after about 4 MB of records (up_to_date false): the rest is asked
    // for from its next_offset, until the records reach those shown already.
    const records = [];
    let after = from;
    while (after < first - 1) {
      const data = await getJSON(`${api}/stream?offset=${after}&limit=${first - 1 - after}`);
      const got = data.records.filter((rec) => rec.offset > after && rec.offset < first);
      records.push(...got);
      if (!got.length || data.up_to_date) break;
      after = got[got.length - 1].offset;
    }
    const ctx = { into: null, messages: new Map(), calls: new Map(), prepend: true, seen: new Set() };
    const items = [];
    for (const rec of records) items.push(...render(rec, ctx));
    timeline.prepend(...items);
    joinLater(ctx);
    first = from + 1;
    earlier.hidden = first <= 0;
  }
  earlier.addEventListener("click", () => loadEarlier().catch(problem));

  let source = null;
  let retries = 0;
  function setState(text, cls) {
    liveState.textContent = text;
    liveState.className = `state ${cls || ""}`;
  }
  function follow() {
    if (source) source.close();
    // The browser resumes a dropped stream itself (Last-Event-ID); when it gives up for good
    // (a non-200 answer, e.g. 503 while the server restarts) a new one starts from `last`.
    source = new EventSource(`${api}/stream?offset=${last}`, { withCredentials: true });
    source.onopen = () => { retries = 0; setState("live", "ok"); soon(); };
    source.onmessage = (event) => take(JSON.parse(event.data));
    source.onerror = () => {
      if (page.dataset.exists === "yes") setState("reconnecting…", "warn");
      if (source.readyState === EventSource.CLOSED) {
        source.close();
        source = null;
        retries += 1;
        setTimeout(follow, Math.min(5000, 250 * 2 ** Math.min(retries, 5)));
      }
    };
  }

  // --- submissions ---------------------------------------------------------------------------
  function inSeconds(unix, now) {
    if (unix === null || unix === undefined) return "";
    const s = Math.round(unix - now);
    const abs = Math.abs(s);
    const text = abs >= 3600 ? `${Math.round(abs / 360) / 10} h` : abs >= 60 ? `${Math.round(abs / 6) / 10} min` : `${abs} s`;
    return s >= 0 ? `in ${text}` : `${text} ago`;
  }
  async function refreshSubmissions() {
    const data = await getJSON(`${root}/admin/submissions?conversation=${encodeURIComponent(conversationId)}`);
    const subs = [...data.unsettled, ...data.recent].sort((a, b) => b.accepted_at - a.accepted_at);
    const tbody = document.querySelector("#submissions tbody");
    const rows = subs.map((s) => {
      // Attempts that a durable wait or a graceful shutdown ended are not counted (nor shown
      // as recoveries): only those cut off are.
      const counted = s.attempt - (s.waits || 0) - (s.releases || 0);
      const tr = el("tr", `status-${s.status}` + (counted > 1 ? " recovered" : ""));
      tr.dataset.submission = s.id;
      const lease = s.lease_owner ? `${s.lease_owner} (${inSeconds(s.lease_expires_at, data.now)})` : "";
      let error = "";
      if (s.error) {
        error = `${s.error.type}: ${s.error.message}`;
        const tools = (s.error.interrupted_tools || []).map((t) => t.name);
        if (tools.length) error += ` · interrupted: ${tools.join(", ")}`;
      }
      const attempts = counted === s.attempt ? `${s.attempt}/${s.max_attempts}` : `${counted}/${s.max_attempts} (attempt ${s.attempt})`;
      const cells = [s.id, kindText(s), s.status, attempts,
        s.outcome ? "" : inSeconds(s.deadline, data.now), lease, s.outcome || "", error];
      const names = ["id", "kind", "status", "attempt", "deadline", "lease", "outcome", "error"];
      cells.forEach((c, i) => tr.append(el("td", names[i], c)));
      if (counted > 1) tr.querySelector(".attempt").classList.add("recovery");
      return tr;
    });
    tbody.replaceChildren(...rows);
    const stuck = document.getElementById("stuck");
    stuck.replaceChildren(...data.stuck.map((s) => el("p", "stuck recovery", `stuck: ${s.submission_id}: ${s.reason}`)));
  }
  function kindText(s) {
    // Where it came from: a webhook delivery or a schedule's occurrence (null: sent directly).
    const src = s.source;
    if (!src) return s.kind;
    if (src.channel) return `${s.kind} · ${src.channel} #${src.delivery_id}`;
    if (src.schedule) return `${s.kind} · ${src.schedule} @${src.occurrence}`;
    return `${s.kind} · ${JSON.stringify(src)}`;
  }

  // --- durable waits: a tool asked the outside world for a value -----------------------------
  // Each pending wait's item is made once and kept across refreshes: rebuilt every 3 s, its
  // form lost what a person was typing, and a click then sent the value it was made with.
  const waitItems = new Map();
  async function refreshWaits() {
    const data = await getJSON(`${api}/waits`);
    const list = document.getElementById("waits");
    const pendingIds = new Set(data.waits.map((w) => w.wait_id));
    for (const [id, li] of waitItems) {
      if (!pendingIds.has(id)) { li.remove(); waitItems.delete(id); }
    }
    for (const w of data.waits) {
      if (!waitItems.has(w.wait_id)) {
        const li = waitItem(w);
        waitItems.set(w.wait_id, li);
        list.append(li);
      }
    }
    document.getElementById("waits-section").hidden = data.waits.length === 0;
  }
  function waitItem(w) {
    const li = el("li", "wait");
    li.dataset.wait = w.wait_id;
    li.append(el("strong", "name", w.name), el("span", "muted", ` · ${w.submission_id}`));
    if (w.expires_at) li.append(el("span", "muted", ` · until ${w.expires_at}`));
    li.append(el("pre", "prompt", show(w.prompt)));
    const form = el("form", "resolve");
    const input = el("input", "value");
    input.type = "text";
    input.placeholder = "a JSON value, e.g. true";  // nothing given until a person gives it
    input.setAttribute("aria-label", `value for ${w.name} (JSON)`);
    const button = el("button", "resolve-button", "resolve");
    button.type = "submit";
    form.append(input, button);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      let value;
      if (input.value.trim() === "") { problem(new Error("give the value to resolve it with (JSON)")); return; }
      try { value = JSON.parse(input.value); } catch (err) { problem(new Error(`not JSON: ${input.value}`)); return; }
      try {
        const done = await post(`${api}/waits/${encodeURIComponent(w.wait_id)}`, { value });
        result.className = "muted";
        result.textContent = `${done.wait_id} resolved; ${done.submission_id} runs again`;
        soon();
      } catch (err) { problem(err); }
    });
    li.append(form);
    return li;
  }

  let pending = null;
  function soon() {
    if (pending) return;
    pending = setTimeout(() => {
      pending = null;
      // A background refresh that fails (the server restarting) says so beside the table only.
      Promise.all([refreshSubmissions(), refreshWaits()]).then(
        () => { refreshNote.textContent = ""; window.hearthConsole.refreshes += 1; },
        (err) => { refreshNote.textContent = `not refreshed: ${err.message || err}`; },
      );
    }, 150);
  }
  setInterval(soon, 3000);

  // --- actions -------------------------------------------------------------------------------
  function problem(err) { result.textContent = String(err.message || err); result.className = "problem"; }
  async function post(url, payload) {
    const r = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json", accept: "application/json" },
      body: JSON.stringify(payload),
    });
    const data = await r.json();
    if (!r.ok) throw new Error(data.error ? data.error.message : `HTTP ${r.status}`);
    return data;
  }
  // (A child task's page has neither: it takes no input nor an abort; its root conversation does.)
  document.getElementById("send-form")?.addEventListener("submit", async (event) => {
    event.preventDefault();
    const box = document.getElementById("message");
    try {
      const receipt = await post(api, { message: box.value });
      box.value = "";
      result.className = "muted";
      result.textContent = `admitted ${receipt.submission_id}`;
      if (page.dataset.exists !== "yes") { location.reload(); return; }
      soon();
    } catch (err) { problem(err); }
  });
  document.getElementById("abort")?.addEventListener("click", async () => {
    try {
      const done = await post(`${api}/abort`, {});
      result.className = "muted";
      result.textContent = done.aborted ? `abort requested for ${done.submission_ids.join(", ")}` : "nothing to abort";
      soon();
    } catch (err) { problem(err); }
  });

  // --- start ---------------------------------------------------------------------------------
  // A page left for another stays alive in the browser's back/forward cache: its stream kept
  // one of the six connections a browser opens to a host, and the seventh page never loaded.
  window.addEventListener("pagehide", () => {
    if (source) { source.close(); source = null; }
  });
  window.addEventListener("pageshow", (event) => {
    if (event.persisted) { follow(); soon(); }
  });
  if (page.dataset.exists === "yes") {
    openNewest().then(follow, (err) => { problem(err); follow(); });
    soon();
  } else {
    // Followed all the same (its stream answers 404, asked again every few seconds): records
    // sent from elsewhere show as they come.
    setState("no records yet", "");
    follow();
  }
})();
