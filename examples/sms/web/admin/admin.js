// The operators' tools. Nothing inline in index.html: the page's
// Content-Security-Policy runs this file only. Every figure comes from the
// API with the bearer token, which is kept in sessionStorage (gone with the
// tab) and written into the page as text only (textContent, never HTML).
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const KEY = "smsAdminToken";
  let current = null; // {phone, country} of the number shown

  function wait(seconds) {
    const s = Math.max(0, Math.ceil(seconds));
    if (s === 0) return "now";
    if (s < 60) return s + " s";
    if (s < 3600) return Math.ceil(s / 60) + " min";
    let h = Math.floor(s / 3600), m = Math.ceil((s % 3600) / 60);
    if (m === 60) { h++; m = 0; }
    return h + " h" + (m ? " " + m + " min" : "");
  }

  function say(text, kind) {
    const st = $("status");
    st.textContent = text;
    st.className = kind || "";
  }

  function showToken() {
    $("token-state").textContent = sessionStorage.getItem(KEY)
      ? "A token is in use for this tab." : "No token given: the figures need one.";
  }

  // api calls the API; it throws with a message for people on any answer
  // but a 2xx.
  async function api(method, path, body) {
    const token = sessionStorage.getItem(KEY);
    if (!token) throw new Error("Give the admin token first.");
    const init = { method, headers: { Authorization: "Bearer " + token } };
    if (body) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const res = await fetch(path, init);
    const data = await res.json().catch(() => ({}));
    if (res.status === 401) {
      sessionStorage.removeItem(KEY); // give it again
      showToken();
      throw new Error("The token was refused.");
    }
    if (!res.ok) throw new Error(data.error || "Error " + res.status);
    return data;
  }

  function cell(row, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }

  async function loadBudget() {
    const b = await api("GET", "/api/budget");
    $("budget").textContent = b.used + " sent of " + b.limit + " today (" + b.day + ", " + b.zone + "), " +
      b.left + " left; resets in " + wait(b.resets_in) + ".";
  }

  // loadSpend shows today's spend by country and each country's share of
  // the day's money for codes not verified (GET /api/spend).
  async function loadSpend() {
    const s = await api("GET", "/api/spend");
    const body = $("spend-countries");
    body.replaceChildren();
    if (!s.on) {
      $("spend").textContent = "The money guards are off.";
      $("spend-table").hidden = true;
      return;
    }
    $("spend").textContent = s.left + " " + s.currency + " left of " + s.limit + " today (" + s.day + "), " +
      s.open_left + " of it outside the reserve; a country may spend " + s.share + " on codes not verified, and up to 16 times that as its codes are verified.";
    for (const c of s.countries) {
      const row = document.createElement("tr");
      cell(row, c.country);
      cell(row, c.spent);
      cell(row, c.price);
      const spent = Number(c.share_left) <= 0;
      cell(row, spent ? "none: only codes verified" : c.share_left + " of " + c.share_cap, spent ? "denied" : "");
      body.appendChild(row);
    }
    $("spend-table").hidden = s.countries.length === 0;
  }

  const pct = (f) => Math.round(100 * f) + "%";
  const WHY = {
    "pooled-conversion": "codes not verified",
    "pooled-conversion-pending": "codes not verified yet",
    "velocity": "far above its usual rate",
  };

  // loadPools shows the scopes the pools refused lately, paused or held,
  // with the figures behind each refusal (GET /api/pools).
  async function loadPools() {
    const p = await api("GET", "/api/pools");
    const body = $("pools");
    body.replaceChildren();
    let paused = 0;
    for (const x of p.pools) {
      const w = x.why || { tally: {} };
      const row = document.createElement("tr");
      cell(row, x.scope);
      cell(row, x.country);
      cell(row, x.prefix || "");
      if (x.paused) paused++;
      cell(row, x.paused ? "paused, " + wait(x.left) + " left" : "held", x.paused ? "denied" : "");
      cell(row, (w.rule || "") + (WHY[w.rule] ? ": " + WHY[w.rule] : ""));
      if (w.rule === "velocity") {
        cell(row, w.tally.verified + " / " + w.tally.sent + " today");
        cell(row, w.upper + " sent in 2 h / " + w.bar);
      } else {
        cell(row, w.tally.verified + " / " + w.tally.sent + (w.tally.open ? " (" + w.tally.open + " open)" : ""));
        cell(row, pct(w.upper) + " / " + pct(w.bar));
      }
      cell(row, w.usual >= 0 ? pct(w.usual) : "not known");
      body.appendChild(row);
    }
    $("pools-table").hidden = p.pools.length === 0;
    $("pools-none").textContent = !p.on ? "The pools are off."
      : p.pools.length === 0 ? "Nothing refused lately." : p.pools.length + " refused lately, " + paused + " paused.";
  }

  function showNumber(n) {
    const facts = [n.number + " (" + n.country + ", prefix " + n.prefix + ")"];
    facts.push(n.locked_out ? "locked out of verification" : "not locked out");
    facts.push(n.code_outstanding ? "a code is outstanding (expires in " + wait(n.code_expires_in) + ")" : "no code outstanding");
    facts.push(n.prefix_paused ? "its prefix is paused for " + wait(n.prefix_pause_left) : "its prefix is not paused");
    $("number-summary").textContent = facts.join("; ") + ".";
    const body = $("guards");
    body.replaceChildren();
    for (const g of n.guards) {
      for (const r of g.rules) {
        const row = document.createElement("tr");
        cell(row, g.scope);
        cell(row, r.rule);
        cell(row, String(r.remaining), r.remaining > 0 ? "" : "denied");
        cell(row, wait(r.retry_after), r.retry_after > 0 ? "denied" : "");
        body.appendChild(row);
      }
    }
    $("number-state").hidden = false;
  }

  async function lookUp() {
    const q = new URLSearchParams({ phone: current.phone, country: current.country });
    showNumber(await api("GET", "/api/number?" + q));
  }

  async function loadPrefixes() {
    const p = await api("GET", "/api/prefixes");
    const body = $("prefixes");
    body.replaceChildren();
    for (const x of p.paused) {
      const row = document.createElement("tr");
      cell(row, x.prefix);
      cell(row, x.verified + " / " + x.judged);
      cell(row, wait(x.left));
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = "Resume";
      button.addEventListener("click", () => run(async () => {
        await api("POST", "/api/prefixes/resume", { id: x.id });
        say("Prefix " + x.prefix + " resumed.", "ok");
        await loadPrefixes();
      }));
      cell(row, "").appendChild(button);
      body.appendChild(row);
    }
    $("prefixes-table").hidden = p.paused.length === 0;
    $("prefixes-none").textContent = !p.conversion ? "The conversion guard is off."
      : p.paused.length === 0 ? "No prefix is paused." : p.paused.length + " paused.";
  }

  // run runs f, and says its error, if any.
  async function run(f) {
    try {
      await f();
    } catch (e) {
      say(e.message, "error");
    }
  }

  function loadAll() {
    run(async () => {
      await loadBudget();
      await loadSpend();
      await loadPools();
      await loadPrefixes();
      if (current) await lookUp();
    });
  }

  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $("token").value);
    $("token").value = "";
    showToken();
    say("");
    loadAll();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    showToken();
  });
  $("budget-refresh").addEventListener("click", () => run(loadBudget));
  $("prefixes-refresh").addEventListener("click", () => run(loadPrefixes));
  $("spend-refresh").addEventListener("click", () => run(loadSpend));
  $("pools-refresh").addEventListener("click", () => run(loadPools));
  $("number-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    current = { phone: $("phone").value, country: $("country").value };
    say("");
    run(lookUp);
  });
  $("reset").addEventListener("click", () => run(async () => {
    await api("POST", "/api/number/reset", current);
    say("The number's limits and lockout are reset.", "ok");
    await lookUp();
    await loadBudget();
  }));

  showToken();
  if (sessionStorage.getItem(KEY)) loadAll();
})();
