// sparkbus Explorer: the dashboard's filter and its refresh every few seconds. Values are put into the
// page as text (textContent), never as markup.
"use strict";

function formatSize(bytes) {
  if (bytes === null || bytes === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB"];
  let amount = bytes, unit = 0;
  while (amount >= 1024 && unit < units.length - 1) { amount /= 1024; unit += 1; }
  return unit === 0 ? amount.toFixed(0) + " B" : amount.toFixed(1) + " " + units[unit];
}

function entityLink(path) {
  return "/entities/" + path.split("/").map(encodeURIComponent).join("/");
}

function cell(row, text, className, column) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (className) td.className = className;
  if (column) td.dataset.col = column;
  row.appendChild(td);
  return td;
}

function render(table, entities) {
  const body = table.tBodies[0];
  const rows = entities.map(function (e) {
    const tr = document.createElement("tr");
    tr.dataset.path = e.path;
    tr.className = e.kind;
    const name = cell(tr, "", "name");
    const link = document.createElement("a");
    link.href = entityLink(e.path);
    link.textContent = e.path;
    name.appendChild(link);
    cell(tr, e.kind); cell(tr, e.status); cell(tr, e.availability);
    cell(tr, e.active, "n", "active"); cell(tr, e.deferred, "n", "deferred"); cell(tr, e.scheduled, "n", "scheduled");
    cell(tr, e.dead_letter, e.dead_letter ? "n alert" : "n", "dead_letter");
    cell(tr, e.transfer, "n", "transfer"); cell(tr, e.transfer_dead_letter, "n", "transfer_dead_letter");
    cell(tr, formatSize(e.size_in_bytes), "n", "size_in_bytes");
    cell(tr, e.used_percent === null ? "" : e.used_percent.toFixed(2) + " %", "n", "used_percent");
    cell(tr, e.awaiting_fanout, "n", "awaiting_fanout");
    cell(tr, e.partitions, "n");
    return tr;
  });
  body.replaceChildren.apply(body, rows);
  applyFilter();
}

function applyFilter() {
  const filter = document.getElementById("filter");
  const table = document.getElementById("entities");
  if (!filter || !table) return;
  const wanted = filter.value.trim().toLowerCase();
  for (const row of table.tBodies[0].rows) {
    const path = (row.dataset.path || "").toLowerCase();
    row.hidden = wanted !== "" && path.indexOf(wanted) < 0;
  }
}

function setText(id, value) {
  const element = document.getElementById(id);
  if (element) element.textContent = String(value);
}

async function refresh(table) {
  try {
    const answer = await fetch(table.dataset.refresh, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!answer.ok) return;
    const board = await answer.json();
    render(table, board.entities);
    const ns = board.namespace;
    setText("incoming", ns.incoming_messages); setText("outgoing", ns.outgoing_messages);
    setText("credits-used", ns.credits_used); setText("throttled", ns.throttled_requests);
    setText("as-of", board.time_utc.replace("T", " ").slice(0, 19));
  } catch (error) {
    // the server went away or the network failed: keep the last figures, try again later
  }
}

document.addEventListener("DOMContentLoaded", function () {
  const filter = document.getElementById("filter");
  if (filter) filter.addEventListener("input", applyFilter);
  const table = document.getElementById("entities");
  if (table && table.dataset.refresh) setInterval(function () { refresh(table); }, 5000);
});
