"""``GET /``: a small chat page -- streaming, a model picker, stop -- with no external assets.

Everything is inline, so it works offline; the Content-Security-Policy
allows nothing else (no remote scripts, styles, images or connections but
this server).  Replies are inserted as text, never as HTML.
"""
from __future__ import annotations

from starlette.responses import HTMLResponse

CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>elelem chat</title>
<style>
 body{font:15px/1.45 system-ui,sans-serif;margin:0;display:flex;flex-direction:column;height:100vh;background:#f6f6f4}
 header{display:flex;gap:.6em;align-items:center;padding:.5em 1em;background:#24292f;color:#fff}
 header b{margin-right:auto} select,input{font:inherit}
 #log{flex:1;overflow-y:auto;padding:1em}
 .msg{max-width:48em;margin:.4em auto;padding:.5em .8em;border-radius:8px;white-space:pre-wrap}
 .user{background:#dbeafe}.assistant{background:#fff;border:1px solid #ddd}.error{background:#fee2e2}
 form{display:flex;gap:.5em;padding:.7em 1em;background:#fff;border-top:1px solid #ddd}
 textarea{flex:1;font:inherit;min-height:2.6em;resize:vertical} button{font:inherit;padding:0 1.2em}
</style></head><body>
<header><b>elelem</b><label>model <select id="model"></select></label>
<input id="key" type="password" placeholder="API key (if any)" size="16"><button id="reset" type="button">new chat</button></header>
<div id="log"></div>
<form id="form"><textarea id="input" placeholder="Message (Enter sends, Shift+Enter: new line)"></textarea>
<button id="send">Send</button><button id="stop" type="button" disabled>Stop</button></form>
<script>
"use strict";
const $ = id => document.getElementById(id);
const history = [];
let abort = null;
$("key").value = localStorage.getItem("elelem-key") || "";
$("key").onchange = () => { localStorage.setItem("elelem-key", $("key").value); loadModels(); };
function headers() {
  const h = {"Content-Type": "application/json"};
  if ($("key").value) h["Authorization"] = "Bearer " + $("key").value;
  return h;
}
function add(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role; div.textContent = text;
  $("log").appendChild(div); $("log").scrollTop = $("log").scrollHeight;
  return div;
}
async function loadModels() {
  const r = await fetch("/v1/models", {headers: headers()});
  if (r.status === 401) { $("key").placeholder = "API key needed"; $("key").focus(); return; }
  if (!r.ok) { add("error", "models: " + ((await r.json()).error || {}).message); return; }
  $("model").replaceChildren(...(await r.json()).data.map(m => new Option(m.id, m.id)));
}
async function send(text) {
  history.push({role: "user", content: text}); add("user", text);
  const out = add("assistant", ""); let reply = "";
  abort = new AbortController(); $("stop").disabled = false; $("send").disabled = true;
  try {
    const r = await fetch("/v1/chat/completions", {method: "POST", headers: headers(), signal: abort.signal,
      body: JSON.stringify({model: $("model").value, messages: history, stream: true})});
    if (!r.ok) throw new Error(((await r.json()).error || {}).message || r.statusText);
    const reader = r.body.getReader(), decoder = new TextDecoder(); let buffer = "";
    for (;;) {
      const {value, done} = await reader.read(); if (done) break;
      buffer += decoder.decode(value, {stream: true});
      const events = buffer.split("\\n\\n"); buffer = events.pop();
      for (const event of events) {
        const data = event.replace(/^data: /, "");
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        const delta = (chunk.choices[0] || {}).delta || {};
        if (delta.content) { reply += delta.content; out.textContent = reply; $("log").scrollTop = $("log").scrollHeight; }
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") add("error", String(e.message || e));
  } finally {
    history.push({role: "assistant", content: reply});
    abort = null; $("stop").disabled = true; $("send").disabled = false;
  }
}
$("form").onsubmit = e => { e.preventDefault(); const t = $("input").value.trim(); if (t && !abort) { $("input").value = ""; send(t); } };
$("input").onkeydown = e => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); } };
$("stop").onclick = () => abort && abort.abort();
$("reset").onclick = () => { if (abort) abort.abort(); history.length = 0; $("log").replaceChildren(); };
loadModels();
</script></body></html>
"""


def chat_page() -> HTMLResponse:
    return HTMLResponse(PAGE, headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                                       "Cache-Control": "no-cache"})
