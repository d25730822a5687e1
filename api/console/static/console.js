// The reins console: a little JavaScript over server-rendered pages. Hold countdowns tick, the
// inbox shows new holds as they arrive, and a trajectory's page follows its event stream.
// Without JavaScript every page still works (reload to see changes).
"use strict";

function tickCountdowns() {
  const now = Date.now() / 1000;
  for (const el of document.querySelectorAll(".countdown[data-expires]")) {
    const left = Math.max(0, Math.floor(Number(el.dataset.expires) - now));
    let text = "expired";
    if (left > 0) {
      if (left < 60) text = `${left} s left`;
      else if (left < 3600) text = `${Math.floor(left / 60)} min ${String(left % 60).padStart(2, "0")} s left`;
      else text = `${Math.floor(left / 3600)} h ${String(Math.floor(left % 3600 / 60)).padStart(2, "0")} min left`;
    }
    if (el.textContent !== text) el.textContent = text;
  }
}

async function fetchHtml(url) {
  const reply = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
  if (reply.status === 303 || reply.redirected) { window.location.assign("/ui/signin"); return null; }
  if (!reply.ok) return null;
  const holder = document.createElement("template");
  holder.innerHTML = await reply.text();
  return holder.content;
}

// Holds are added and removed by key, so a card being read or a comment being typed stays.
async function refreshInbox(inbox) {
  const fresh = await fetchHtml(inbox.dataset.refresh);
  if (fresh === null) return;
  const list = inbox.querySelector("ol.cards");
  const wanted = new Map([...fresh.querySelectorAll("li[data-key]")].map((li) => [li.dataset.key, li]));
  for (const li of [...list.querySelectorAll("li[data-key]")]) {
    if (!wanted.has(li.dataset.key) && !li.contains(document.activeElement)) li.remove();
  }
  const have = new Set([...list.querySelectorAll("li[data-key]")].map((li) => li.dataset.key));
  for (const [key, li] of wanted) if (!have.has(key)) list.appendChild(document.importNode(li, true));
  inbox.querySelector(".empty").hidden = list.children.length > 0;
}

// Each event of the stream fetches the page's live part again; slots whose content changed are
// replaced in place (each keeps its size), so nothing above a change moves.
function followTrajectory(live) {
  let pending = false;
  let again = false;
  async function refresh() {
    if (pending) { again = true; return; }
    pending = true;
    try {
      const fresh = await fetchHtml(live.dataset.live);
      if (fresh === null) return;
      for (const slot of fresh.querySelectorAll("[data-slot]")) {
        const mine = live.querySelector(`[data-slot="${slot.dataset.slot}"]`);
        if (mine && mine.innerHTML !== slot.innerHTML && !mine.contains(document.activeElement)) {
          mine.innerHTML = slot.innerHTML;
        }
      }
    } finally {
      pending = false;
      if (again) { again = false; refresh(); }
    }
  }
  const stream = new EventSource(live.dataset.events);
  const onEvent = (event) => {
    live.dataset.received = String(Number(live.dataset.received) + 1);
    if (event.type === "stop") { stream.close(); live.dataset.ended = "true"; }
    refresh();
  };
  for (const kind of ["model", "tool", "control", "approval", "stop"]) stream.addEventListener(kind, onEvent);
  stream.onerror = () => { if (live.dataset.ended === "true") stream.close(); };
}

document.addEventListener("DOMContentLoaded", () => {
  tickCountdowns();
  setInterval(tickCountdowns, 1000);
  const inbox = document.getElementById("inbox");
  if (inbox) setInterval(() => refreshInbox(inbox), 2000);
  const live = document.getElementById("live");
  if (live && live.dataset.ended !== "true") followTrajectory(live);
});
