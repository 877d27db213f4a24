// The verification page. No framework, and nothing inline in index.html:
// the page's Content-Security-Policy runs this file and no other script.
//
// The server is authoritative: the page sends the number as typed with the
// country picked, and shows the number the server read. The preview under
// the field is only a help for the eye: it never says a text will be sent,
// which only the server's 202 tells ("Code sent to ...").
//
// Timers: the send button's countdown is the page's only timer (no polling:
// the demo outbox is refreshed after each send, when the page is shown
// again, and by its Refresh button). It stops when it reaches zero, when the
// number it was for is changed, when a demo's limits are reset, and once a
// code is verified, after which the send button is back to "Send code", for
// another number.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const countrySelect = $("country"), phone = $("phone"), e164 = $("e164");
  const sendButton = $("send"), code = $("code"), verifyButton = $("verify");
  const statusBox = $("status-box"), statusLine = $("status"), nextLine = $("next"), renewButton = $("renew");
  const SEND_TEXT = "Send code", RENEW_TEXT = "Request a new code";

  const countries = new Map(); // region -> {region, code, name}
  let callingCodes = []; // the calling codes offered, for a number typed with +
  let outboxShown = false;
  let demo = false; // a local demo: its limits can be reset (settings.demo)
  // The number the server last texted, E.164, and the form it was sent
  // from: the finished state names it if the form is unchanged.
  let sent = { number: "", form: "" };

  // wait says a number of seconds as people read it: "45 s" under a minute,
  // "47 min" (rounded up) under an hour, "2 h 5 min" beyond; as the server
  // words it.
  function wait(seconds) {
    const s = Math.max(0, Math.ceil(seconds));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.ceil(s / 60) + " min";
    let h = Math.floor(s / 3600), m = Math.ceil((s % 3600) / 60);
    if (m === 60) { h++; m = 0; }
    return h + " h" + (m ? " " + m + " min" : "");
  }

  // say shows a message: text, and next, what to do now, if anything.
  function say(text, kind, next) {
    statusLine.textContent = text;
    statusBox.className = kind || "";
    nextLine.textContent = next || "";
    nextLine.hidden = !next;
    renewButton.hidden = true;
    $("demo").classList.remove("attention");
  }

  // sentence makes an error of the server a sentence: capital, full stop.
  function sentence(s) {
    s = String(s).trim();
    if (!s) return "Something went wrong: try again.";
    s = s[0].toUpperCase() + s.slice(1);
    return /[.!?]$/.test(s) ? s : s + ".";
  }

  // digits returns the decimal digits of s in ASCII, whatever their script
  // (the server reads full-width and other digits too). Unicode encodes the
  // digits of each script as runs of 0 to 9, so a digit's value is its
  // distance from the start of its run, modulo 10.
  const ND = /\p{Nd}/u;
  function digits(s) {
    let out = "";
    for (const ch of s) {
      if (!ND.test(ch)) continue;
      const cp = ch.codePointAt(0);
      let n = 0;
      while (cp - n - 1 >= 0 && ND.test(String.fromCodePoint(cp - n - 1))) n++;
      out += n % 10;
    }
    return out;
  }

  // The national prefix dialled before a number inside its country, where
  // it is not 0 (none in Italy and San Marino, 1 in the NANP).
  const trunks = { 1: "1", 39: "", 378: "" };

  // readable reports whether the server could read s as a number: it has a
  // digit, and only the characters of a written number, as phonekey takes
  // them (digits of any script, a plus, spaces, - . ( ) and their full-width
  // forms). The preview is shown only then: "Read as +86" under "abc" would
  // say the page read a number where the server reads none.
  const NUMBER_CHARS = /^[\p{Nd}+\uff0b \u00a0\u3000\-\u2010-\u2014\u2212\uff0d.\uff0e()\uff08\uff09]*$/u;
  function readable(s) { return ND.test(s) && NUMBER_CHARS.test(s); }

  // preview returns the number as the server will read it, in E.164 with a
  // space after the country code: a number typed with + as it is (the
  // picker is ignored), otherwise the picked country's code and the
  // national number without its trunk prefix.
  function preview() {
    const typed = phone.value.trim();
    const d = digits(typed);
    if (/^[+\uff0b]/.test(typed)) {
      // Calling codes are prefix-free: at most one matches.
      const cc = callingCodes.find((c) => d.startsWith(c));
      return cc ? ("+" + cc + " " + d.slice(cc.length)).trim() : "+" + d;
    }
    const c = countries.get(countrySelect.value);
    if (!c) return d;
    const trunk = c.code in trunks ? trunks[c.code] : "0";
    const national = trunk && d.startsWith(trunk) ? d.slice(trunk.length) : d;
    return ("+" + c.code + " " + national).trim();
  }

  // The countdown of the send button.
  let countdown = null; // {timer, number}: number, when the wait is that number's

  // sendState sets the send button, and the "Request a new code" button,
  // which sends the same form.
  function sendState(disabled, text) {
    sendButton.disabled = disabled;
    sendButton.textContent = text;
    renewButton.disabled = disabled;
    renewButton.textContent = !disabled ? RENEW_TEXT : text.replace(/^Resend in /, "New code in ");
  }

  function startCountdown(seconds, number) {
    stopCountdown();
    const until = Date.now() + Math.max(0, seconds) * 1000;
    const tick = () => {
      const left = (until - Date.now()) / 1000;
      if (left <= 0) { stopCountdown(); return; }
      sendState(true, "Resend in " + wait(left));
    };
    countdown = { timer: setInterval(tick, 1000), number };
    tick();
  }

  function stopCountdown() {
    if (countdown) clearInterval(countdown.timer);
    countdown = null;
    sendState(false, SEND_TEXT);
  }

  function formValue() { return countrySelect.value + " " + phone.value; }

  function codeUsable(usable) {
    code.disabled = !usable;
    verifyButton.disabled = !usable;
  }

  function numberChanged() {
    const n = preview();
    e164.textContent = n;
    $("e164-line").hidden = !readable(phone.value);
    // A wait for one number does not hold another one back (the server
    // still has the last word); a wait for this address or the service does.
    if (countdown && countdown.number && countdown.number !== n) stopCountdown();
    codeUsable(true); // another number may have a live code
  }

  async function post(path, body) {
    let res;
    try {
      res = await fetch(path, {
        method: "POST", cache: "no-store",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      });
    } catch (e) {
      return { status: 0, data: {}, retry: 0 };
    }
    let data = {};
    try { data = await res.json(); } catch (e) { /* not JSON */ }
    const retry = Number(data.retry_after ?? res.headers.get("Retry-After") ?? 0) || 0;
    return { status: res.status, data, retry };
  }

  const UNREACHABLE = "Could not reach the service: check your connection and try again.";

  // throttled words a 429 by its scope, with the wait.
  const scopes = {
    number: "Too many codes for this number",
    ip: "Too many requests from your address",
    prefix: "Too many codes to numbers like this one",
    budget: "The service has sent all the codes it may for now",
  };
  function throttled(r) {
    const why = r.data.rule === "verify-failures" ? "Too many failed verifications for this number"
      : scopes[r.data.scope] || "Too many requests";
    return why + ": try again in " + wait(Math.max(r.retry, 1)) + ".";
  }

  // A wait longer than this is not one to sit out with the page open.
  const LONG_WAIT = 120;

  // comeBack says when a wait of seconds ends, on the visitor's clock,
  // rounded up to the minute.
  function comeBack(seconds) {
    const at = new Date(Math.ceil((Date.now() + seconds * 1000) / 60000) * 60000);
    const hm = at.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    const day = at.toDateString() === new Date().toDateString() ? "" : "tomorrow ";
    return "Come back " + day + "at " + hm + " or later.";
  }

  // sayThrottled shows a 429: what limit, how long, and, for a long wait,
  // what to do: in a local demo, the control that lifts the limits; else
  // when to come back.
  function sayThrottled(r) {
    const seconds = Math.max(r.retry, 1);
    if (seconds < LONG_WAIT) {
      say(throttled(r), "err");
      return;
    }
    if (demo) {
      say(throttled(r), "err", "This is a local demo: \u201cReset demo limits\u201d below lifts the limits now.");
      $("demo").classList.add("attention");
      return;
    }
    say(throttled(r), "err", comeBack(seconds));
  }

  // What each kind of number refused (reason of a 422) is, for people.
  const kinds = {
    landline: "a landline", toll_free: "a toll-free number", premium_rate: "a premium-rate number",
    shared_cost: "a shared-cost number", voip: "an internet (VoIP) number",
    personal_number: "a personal (forwarding) number", pager: "a pager",
    uan: "a company (universal access) number", voicemail: "a voicemail access number",
    unknown: "not a number known to be a mobile",
  };

  function regionName(region) {
    const c = countries.get(region);
    if (c) return c.name;
    try {
      return new Intl.DisplayNames(["en"], { type: "region" }).of(region) || region;
    } catch (e) {
      return region;
    }
  }

  // refusal words a 422: why the number gets no code, and what to do.
  function refusal(d) {
    const n = d.number || "This number";
    if (d.reason in kinds) {
      return [n + " is " + kinds[d.reason] + ", which cannot receive text messages.", "Give a mobile number."];
    }
    switch (d.reason) {
      case "satellite":
        return [n + " is a satellite or non-geographic number, which gets no codes.", "Give a mobile number."];
      case "country": {
        const names = [...countries.values()].map((c) => c.name);
        return ["This service does not send codes to numbers of " + regionName(d.country) + ".",
          names.length && names.length <= 10 ? "It sends them to numbers of " + names.join(", ") + "." : "Pick a country from the list."];
      }
      case "provider_refused":
        return ["The SMS provider would not take " + n + ".", "Give another mobile number."];
    }
    return [sentence(d.error), ""];
  }

  $("send-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (sendButton.disabled) return;
    const number = preview(), form = formValue();
    sendState(true, "Sending…");
    const r = await post("/api/sms/send", { phone: phone.value, country: countrySelect.value });
    switch (r.status) {
      case 202:
        // The number as the server read and texted it: never the one typed.
        sent = { number: r.data.number || "", form };
        say(sent.number ? "Code sent to " + sent.number + "." : "Code sent.", "ok");
        startCountdown(r.retry, number);
        codeUsable(true);
        code.focus();
        refreshOutbox();
        return;
      case 429:
        sayThrottled(r);
        startCountdown(Math.max(r.retry, 1), r.data.scope === "number" ? number : null);
        return;
      case 0:
        say(UNREACHABLE, "err");
        break;
      case 400: {
        const c = countries.get(countrySelect.value);
        const where = c && !/^[+\uff0b]/.test(phone.value.trim()) ? " for " + c.name : "";
        say("Not a valid phone number" + where + ": check the number and the country.", "err");
        break;
      }
      case 422: { // the number gets no code: say why, in words
        const [why, next] = refusal(r.data);
        say(why, "err", next);
        break;
      }
      default: // 502, 503
        say(sentence(r.data.error), "err");
    }
    if (r.retry > 0) startCountdown(r.retry, null);
    else stopCountdown();
  });

  $("verify-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const c = digits(code.value);
    if (c.length !== 6) {
      say("The code has 6 digits.", "err");
      code.focus();
      return;
    }
    verifyButton.disabled = true;
    const r = await post("/api/sms/verify", { phone: phone.value, country: countrySelect.value, code: c });
    verifyButton.disabled = false;
    if (r.status === 200 && r.data.verified) {
      finished();
      return;
    }
    switch (r.status) {
      case 401:
        if (r.data.attempts_left === 0) {
          spent();
        } else {
          say("Wrong or expired code.", "err");
        }
        break;
      case 429: sayThrottled(r); break;
      case 0: say(UNREACHABLE, "err"); break;
      default: say(sentence(r.data.error), "err");
    }
  });

  // spent: the last wrong attempt used up the code; only a new one can
  // verify the number.
  function spent() {
    code.value = "";
    codeUsable(false);
    say("Wrong code, and that was the last attempt for this code.", "err", "Request a new code to try again.");
    renewButton.hidden = false;
  }

  // finished replaces the forms by the verified state.
  function finished() {
    stopCountdown(); // done: no resend to wait for
    $("done-number").textContent = sent.number && sent.form === formValue() ? sent.number : preview();
    code.value = "";
    say("");
    $("steps").hidden = true;
    $("done").hidden = false;
    $("again").focus();
  }

  $("again").addEventListener("click", () => {
    $("done").hidden = true;
    $("steps").hidden = false;
    phone.value = "";
    sent = { number: "", form: "" };
    numberChanged();
    phone.focus();
  });

  renewButton.addEventListener("click", () => {
    if (!sendButton.disabled) $("send-form").requestSubmit();
  });

  // The demo's reset of its limits (settings.demo): for this address, and
  // the number in the form.
  async function resetDemo() {
    const button = $("demo-reset"), line = $("demo-status");
    button.disabled = true;
    const r = await post("/api/demo/reset", { phone: phone.value, country: countrySelect.value });
    button.disabled = false;
    if (r.status !== 200) {
      line.textContent = r.status === 0 ? UNREACHABLE : sentence(r.data.error);
      return;
    }
    stopCountdown();
    const what = "Limits reset for your address" + (r.data.number ? " and " + r.data.number : "") + ".";
    line.textContent = what;
    say(what + " You can send a code again.", "ok");
  }

  phone.addEventListener("input", numberChanged);
  countrySelect.addEventListener("change", numberChanged);

  // The demo outbox, served only by a local demo (settings.outbox).
  async function refreshOutbox() {
    if (!outboxShown) return;
    let data;
    try {
      const res = await fetch("/api/sms/outbox", { cache: "no-store" });
      if (!res.ok) return;
      data = await res.json();
    } catch (e) {
      return;
    }
    const items = (data.messages || []).map((m) => {
      const li = document.createElement("li");
      const to = document.createElement("span"), text = document.createElement("span");
      to.className = "to";
      to.textContent = m.to;
      text.className = "text";
      text.textContent = m.text;
      li.append(to, text);
      return li;
    });
    $("outbox-list").replaceChildren(...items);
    $("outbox-empty").hidden = items.length > 0;
  }

  async function start() {
    sendButton.disabled = true;
    let s;
    try {
      const res = await fetch("/api/sms/settings", { cache: "no-store" });
      if (!res.ok) throw new Error("settings: " + res.status);
      s = await res.json();
    } catch (e) {
      // Without the list, the server reads numbers in its default country.
      countrySelect.add(new Option("Default country", ""));
      countrySelect.disabled = true;
      say("Could not load the countries: give the number with + and its country code.", "err");
      sendButton.disabled = false;
      numberChanged();
      return;
    }
    for (const c of s.countries || []) {
      countries.set(c.region, c);
      countrySelect.add(new Option(c.name + " (+" + c.code + ")", c.region));
    }
    callingCodes = [...new Set([...countries.values()].map((c) => String(c.code)))];
    countrySelect.value = s.region;
    sendButton.disabled = false;
    numberChanged();
    if (s.demo) {
      demo = true;
      $("demo").hidden = false;
      $("demo-reset").addEventListener("click", resetDemo);
    }
    if (s.outbox) {
      outboxShown = true;
      $("outbox").hidden = false;
      $("outbox-refresh").addEventListener("click", refreshOutbox);
      document.addEventListener("visibilitychange", () => {
        if (document.visibilityState === "visible") refreshOutbox();
      });
      refreshOutbox();
    }
  }

  start();
})();
