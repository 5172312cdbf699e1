// Warren's web console: a single page over the management HTTP API (the same calls rabbitmqadmin and warrenctl
// make), logged in with a Warren user. What the user's tags do not allow is not shown; the API refuses it anyway.
"use strict";

const REFRESH_MS = 5000; // how often a page reads the API again (the broker samples its rates every 5 s)
const RATE_KEYS = ["publish", "deliver_get", "ack", "redeliver"]; // message rates shown, as RabbitMQ's UI
const RATE_COLOURS = {publish: "#d08020", deliver_get: "#2070c0", ack: "#30a050", redeliver: "#b03060"};
const CHART_PERIOD = "msg_rates_age=600&msg_rates_incr=5"; // ten minutes of samples, one every 5 s
const main = document.getElementById("main");
let credentials = sessionStorage.getItem("warren-credentials"); // "Basic ..." once logged in
let user = null; // {name, tags} of the logged-in user
let refreshTimer = null;

// --- DOM and API helpers ------------------------------------------------------------------------------------------
function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes || {})) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== false && value !== null && value !== undefined) node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

async function api(method, path, body) {
  const response = await fetch("api" + path, {
    method, headers: {"Authorization": credentials, "Content-Type": "application/json",
                      "X-Requested-With": "XMLHttpRequest"}, // no browser login dialog on a 401
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) throw new Error(data && data.reason ? data.reason : `${response.status} ${response.statusText}`);
  return data;
}

const enc = encodeURIComponent;
const has = (...tags) => user && user.tags.some((tag) => tags.includes(tag));
const number = (value) => (value === undefined || value === null ? "" : Number(value).toLocaleString("en"));
const rate = (stats, key) => (stats && stats[key + "_details"] ? stats[key + "_details"].rate.toFixed(1) + "/s" : "");

const bytesRate = (details) => (details ? `${(details.rate / 1024).toFixed(1)} KiB/s` : "");

function showError(error) {
  document.getElementById("status").textContent = error ? String(error.message || error) : "";
}

async function act(action) {
  try {
    showError(null);
    await action();
    await route();
  } catch (error) {
    showError(error);
  }
}

// --- login ----------------------------------------------------------------------------------------------------------
document.getElementById("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.target;
  credentials = "Basic " + btoa(`${form.username.value}:${form.password.value}`);
  try {
    await start();
  } catch (error) {
    credentials = null;
    // the API's reason is "Login failed" itself for wrong credentials; another (no management tag) is told as why
    const reason = error.message;
    document.getElementById("login-error").textContent =
      reason.startsWith("Login failed") ? reason : `Login failed: ${reason}`;
  }
});

document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem("warren-credentials");
  location.hash = "";
  location.reload();
});

async function start() {
  user = await api("GET", "/whoami");
  sessionStorage.setItem("warren-credentials", credentials);
  document.getElementById("who").textContent = `${user.name} (${user.tags.join(", ") || "no tags"})`;
  document.getElementById("logout").hidden = false;
  const nav = document.getElementById("nav");
  nav.hidden = false;
  for (const link of nav.querySelectorAll("a[data-needs]")) link.hidden = !has(...link.dataset.needs.split(" "));
  window.addEventListener("hashchange", route);
  if (!location.hash) location.hash = "#/overview";
  else await route();
}

// --- routing --------------------------------------------------------------------------------------------------------
const PAGES = {overview, queues, queue, exchanges, connections, admin, definitions};

async function route() {
  clearTimeout(refreshTimer);
  const [page, ...args] = location.hash.replace(/^#\//, "").split("/").map(decodeURIComponent);
  const render = PAGES[page] || overview;
  for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("current", link.dataset.page === page);
  try {
    const content = await render(...args);
    main.replaceChildren(content);
    main.dataset.page = page;
  } catch (error) {
    showError(error);
  }
  if (render.refresh) refreshTimer = setTimeout(refresh, REFRESH_MS);
}

async function refresh() {
  const focused = document.activeElement && document.activeElement.closest("form");
  if (focused) { // never redraw a form being filled in
    refreshTimer = setTimeout(refresh, REFRESH_MS);
    return;
  }
  await route();
}

// --- charts ---------------------------------------------------------------------------------------------------------
// Each line has its own colour, width and dashes, widest first, so lines that coincide (publish and deliver/get at
// the same rate) still show each other: the narrower dashed one is drawn over the wider one.
const RATE_LINES = {
  publish: {width: 4.5, dash: null},
  deliver_get: {width: 2.5, dash: "8 4"},
  ack: {width: 2, dash: "2 3"},
  redeliver: {width: 1.5, dash: "10 3 2 3"},
};
const SVG = "http://www.w3.org/2000/svg";

function svgNode(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value !== null && value !== undefined) node.setAttribute(name, value);
  }
  if (text !== undefined) node.textContent = text;
  return node;
}

function lineAttributes(key) {
  return {fill: "none", stroke: RATE_COLOURS[key], "stroke-width": RATE_LINES[key].width,
          "stroke-dasharray": RATE_LINES[key].dash, "stroke-linecap": "butt"};
}

function niceTop(peak) {
  // The scale's top: the least 1, 2 or 5 times a power of ten at or above peak (at least 1/s), and its step.
  const power = 10 ** Math.floor(Math.log10(Math.max(1, peak)));
  for (const [leading, ticks] of [[1, 5], [2, 4], [5, 5], [10, 5]]) {
    if (leading * power >= peak) return {top: leading * power, step: (leading * power) / ticks};
  }
  return {top: peak, step: peak / 5};
}

const clock = (t) => new Date(t).toLocaleTimeString("en-GB", {hour12: false});

function timeTicks(first, last) {
  // Round times (every 5 s .. 10 min, at most 5 of them) between the first and last sample; the two ends when none.
  const span = last - first;
  const step = [5, 10, 15, 30, 60, 120, 300, 600].map((s) => s * 1000).find((s) => span / s <= 4) || 600000;
  const ticks = [];
  for (let t = Math.ceil(first / step) * step; t <= last; t += step) ticks.push(t);
  return ticks.length >= 2 ? ticks : [...new Set([first, last])];
}

function chart(stats) {
  // Rates per second between successive samples of each key, newest on the right, over a scale of messages/s
  // (left) and the samples' times (below).
  const width = 600, height = 190;
  const left = 50, right = width - 30, top = 20, bottom = height - 24; // the plot's edges
  const svg = svgNode("svg", {class: "chart", viewBox: `0 0 ${width} ${height}`, width, height});
  const series = {};
  for (const key of RATE_KEYS) {
    const samples = (stats && stats[key + "_details"] && stats[key + "_details"].samples) || [];
    const points = [];
    for (let i = samples.length - 2; i >= 0; i--) {
      const seconds = (samples[i].timestamp - samples[i + 1].timestamp) / 1000;
      points.push({t: samples[i].timestamp, v: seconds > 0 ? (samples[i].sample - samples[i + 1].sample) / seconds : 0});
    }
    series[key] = points;
  }
  const all = Object.values(series).flat();
  const peak = Math.max(0, ...all.map((p) => p.v));
  const scale = niceTop(peak);
  const first = Math.min(...all.map((p) => p.t)), last = Math.max(...all.map((p) => p.t));
  const x = (t) => (last > first ? left + ((t - first) / (last - first)) * (right - left) : right);
  const y = (v) => bottom - (v / scale.top) * (bottom - top);

  // the scale: a labelled line every step of messages/s, and the times below
  const axis = svgNode("g", {class: "y-axis"});
  axis.append(svgNode("text", {x: 4, y: 12, class: "axis-title"}, "messages/s"));
  for (let i = 0; Math.round(i * scale.step * 1e6) <= Math.round(scale.top * 1e6); i++) {
    const value = Number((i * scale.step).toPrecision(6));
    axis.append(svgNode("line", {x1: left, x2: right, y1: y(value), y2: y(value), class: i ? "grid" : "baseline"}),
                svgNode("text", {x: left - 6, y: y(value) + 4, "text-anchor": "end", class: "tick",
                                 "data-value": value}, value.toLocaleString("en")));
  }
  svg.append(axis);
  const times = svgNode("g", {class: "x-axis"});
  if (all.length) {
    for (const t of timeTicks(first, last)) {
      times.append(svgNode("line", {x1: x(t), x2: x(t), y1: bottom, y2: bottom + 4, class: "baseline"}),
                   svgNode("text", {x: x(t), y: height - 6, "text-anchor": "middle", class: "tick", "data-time": t},
                           clock(t)));
    }
  } else {
    times.append(svgNode("text", {x: (left + right) / 2, y: (top + bottom) / 2, "text-anchor": "middle",
                                  class: "tick"}, "No samples yet"));
  }
  svg.append(times);

  let drawn = 0;
  for (const [key, points] of Object.entries(series)) {
    if (points.length < 1) continue;
    const xy = points.map((p) => [x(p.t).toFixed(1), y(p.v).toFixed(1)]);
    const line = svgNode("polyline", {
      ...lineAttributes(key), "data-key": key, "data-count": points.length,
      "data-peak": Math.max(...points.map((p) => p.v)), points: xy.map(([px, py]) => `${px},${py}`).join(" "),
    });
    line.append(svgNode("title", {}, key.replace("_", "/")));
    svg.append(line);
    if (points.length === 1) { // one point draws no line
      svg.append(svgNode("circle", {cx: xy[0][0], cy: xy[0][1], r: 3, fill: RATE_COLOURS[key], "data-key": key}));
    }
    drawn += points.length;
  }
  svg.setAttribute("data-points", drawn);
  const legend = el("div", {class: "legend"}, RATE_KEYS.map((key) => {
    const swatch = svgNode("svg", {width: 30, height: 10, viewBox: "0 0 30 10", class: "swatch"});
    swatch.append(svgNode("line", {x1: 0, x2: 30, y1: 5, y2: 5, ...lineAttributes(key)}));
    return el("span", {"data-key": key}, swatch, ` ${key.replace("_", "/")} ${rate(stats, key) || "\u2013"}`);
  }));
  return el("div", {}, el("div", {}, `Message rates (peak ${peak.toFixed(1)}/s over the last 10 minutes)`), svg,
            legend);
}

function table(columns, rows, options = {}) {
  // columns: [{title, value(row), number?}]; sortable by clicking a header when options.sortable.
  let sortIndex = options.sortIndex ?? -1, descending = false;
  const body = el("tbody");
  const draw = () => {
    const sorted = [...rows];
    if (sortIndex >= 0) {
      const value = columns[sortIndex].value;
      sorted.sort((a, b) => {
        const x = value(a), y = value(b);
        const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
        return descending ? -order : order;
      });
    }
    body.replaceChildren(...sorted.map((row) => el("tr", {}, columns.map((column) => {
      const content = column.render ? column.render(row) : column.value(row);
      return el("td", {class: column.number ? "number" : null}, column.number ? number(content) : content);
    }))));
  };
  const head = el("tr", {}, columns.map((column, index) => el("th", {
    class: options.sortable ? "sortable" : null,
    onclick: options.sortable ? () => {
      descending = sortIndex === index ? !descending : false;
      sortIndex = index;
      draw();
    } : null,
  }, column.title)));
  draw();
  const titled = columns.some((column) => column.title);
  return el("table", {id: options.id}, titled ? el("thead", {}, head) : null, body);
}

// --- pages ----------------------------------------------------------------------------------------------------------
async function overview() {
  const data = await api("GET", "/overview?" + CHART_PERIOD);
  const totals = data.queue_totals, objects = data.object_totals;
  const tiles = el("div", {class: "tiles"},
    [["Messages", totals.messages], ["Ready", totals.messages_ready], ["Unacked", totals.messages_unacknowledged],
     ["Connections", objects.connections], ["Channels", objects.channels], ["Queues", objects.queues],
     ["Consumers", objects.consumers], ["Exchanges", objects.exchanges]].map(([label, value]) =>
      el("div", {class: "tile", "data-total": label.toLowerCase()}, label, el("b", {}, number(value)))));
  const content = el("div", {}, el("h1", {}, `Overview: ${data.cluster_name} (${data.product_name} ${data.product_version})`),
                     tiles, el("h2", {}, "Message rates"), chart(data.message_stats));
  if (has("monitoring", "administrator")) {
    // A node per worker process with several workers, of every node in a cluster of workers
    const nodes = await api("GET", "/nodes");
    const running = nodes.filter((node) => node.running);
    const alarms = [...new Set(running.flatMap(nodeAlarms))];
    content.append(el("h2", {}, "Nodes"), el("div", {class: "tiles", id: "nodes-summary"},
      el("div", {class: "tile"}, "Memory", el("b", {}, mebibytes(sum(running, "mem_used"))),
         `of ${mebibytes(sum(running, "mem_limit"))} limit`),
      el("div", {class: "tile"}, "Running", el("b", {}, `${running.length} of ${nodes.length}`)),
      el("div", {class: "tile", id: "alarms"}, "Alarms",
         el("b", {class: alarms.length ? "alarm" : null}, alarms.length ? alarms.join(", ") : "none"))),
      table([
        {title: "Name", value: (node) => node.name},
        {title: "State", value: (node) => (node.running ? `up ${uptime(node.uptime)}` : "not running")},
        {title: "Memory", value: (node) => (node.running ? `${mebibytes(node.mem_used)} of ${mebibytes(node.mem_limit)}` : "")},
        {title: "Disk free", value: (node) => (node.running ? `${(node.disk_free / 2 ** 30).toFixed(1)} GiB` : "")},
        {title: "File descriptors", value: (node) => number(node.fd_used)},
        {title: "Clients", value: (node) => number(node.sockets_used)},
        {title: "Alarms", value: (node) => nodeAlarms(node).join(", ")},
      ], nodes, {id: "nodes"}));
  }
  return content;
}

const nodeAlarms = (node) => [node.mem_alarm && "memory", node.disk_free_alarm && "disk"].filter(Boolean);
const sum = (items, key) => items.reduce((total, item) => total + (item[key] || 0), 0);
const mebibytes = (bytes) => `${(bytes / 2 ** 20).toFixed(0)} MiB`;

function uptime(milliseconds) {
  const minutes = Math.floor(milliseconds / 60000);
  return minutes < 60 ? `${minutes} min` : minutes < 2880 ? `${Math.floor(minutes / 60)} h` : `${Math.floor(minutes / 1440)} d`;
}
overview.refresh = true;

function features(queue) {
  const args = queue.arguments || {}, effective = queue.effective_policy_definition || {};
  const badges = [];
  if (queue.durable) badges.push("D");
  if (queue.auto_delete) badges.push("AD");
  if (queue.exclusive) badges.push("Excl");
  if (args["x-dead-letter-exchange"] !== undefined || effective["dead-letter-exchange"] !== undefined) badges.push("DLX");
  if (args["x-message-ttl"] !== undefined || effective["message-ttl"] !== undefined) badges.push("TTL");
  if (args["x-max-length"] !== undefined || args["x-max-length-bytes"] !== undefined ||
      effective["max-length"] !== undefined || effective["max-length-bytes"] !== undefined) badges.push("Lim");
  if (args["x-max-priority"] !== undefined) badges.push("Pri");
  if (queue.policy) badges.push("policy: " + queue.policy);
  return el("span", {}, badges.map((badge) => el("span", {class: "badge"}, badge)));
}

async function queues() {
  const list = await api("GET", "/queues");
  const filter = el("input", {id: "queue-filter", placeholder: "Filter by name"});
  const columns = [
    {title: "Name", value: (q) => q.name, render: (q) => el("a", {href: `#/queue/${enc(q.vhost)}/${enc(q.name)}`}, q.name)},
    {title: "Virtual host", value: (q) => q.vhost},
    {title: "Type", value: (q) => q.type},
    {title: "Features", value: (q) => features(q).textContent, render: features},
    {title: "Ready", value: (q) => q.messages_ready, number: true},
    {title: "Unacked", value: (q) => q.messages_unacknowledged, number: true},
    {title: "Total", value: (q) => q.messages, number: true},
    {title: "Incoming", value: (q) => rate(q.message_stats, "publish")},
    {title: "Deliver/get", value: (q) => rate(q.message_stats, "deliver_get")},
    {title: "Ack", value: (q) => rate(q.message_stats, "ack")},
    {title: "Consumers", value: (q) => q.consumers, number: true},
  ];
  const holder = el("div");
  const draw = () => {
    const text = filter.value.toLowerCase();
    holder.replaceChildren(table(columns, list.filter((q) => q.name.toLowerCase().includes(text)),
                                 {sortable: true, sortIndex: 0, id: "queues"}));
  };
  filter.addEventListener("input", draw);
  draw();
  const vhosts = [...new Set(list.map((q) => q.vhost).concat(["/"]))];
  const form = el("form", {class: "inline", id: "add-queue"},
    el("input", {name: "name", placeholder: "Queue name", required: true}),
    el("select", {name: "vhost"}, vhosts.map((name) => el("option", {}, name))),
    el("label", {}, el("input", {type: "checkbox", name: "durable", checked: true}), " durable"),
    el("button", {type: "submit"}, "Add queue"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    act(() => api("PUT", `/queues/${enc(form.vhost.value)}/${enc(form.name.value)}`,
                  {durable: form.durable.checked, auto_delete: false, arguments: {}}));
  });
  return el("div", {}, el("h1", {}, `Queues (${list.length})`), filter, holder, el("h2", {}, "Add a queue"), form);
}
queues.refresh = true;

async function queue(vhost, name) {
  const path = `/queues/${enc(vhost)}/${enc(name)}`;
  const [q, bindings] = await Promise.all([api("GET", path + "?" + CHART_PERIOD), api("GET", path + "/bindings")]);
  const details = table([{title: "", value: (row) => row[0]}, {title: "", value: (row) => row[1]}], [
    ["Virtual host", q.vhost], ["Type", q.type], ["Features", features(q).textContent],
    ["Ready", number(q.messages_ready)], ["Unacked", number(q.messages_unacknowledged)],
    ["Total", number(q.messages)], ["Consumers", number(q.consumers)], ["Arguments", JSON.stringify(q.arguments)],
  ], {id: "queue-details"});
  const consumers = table([
    {title: "Consumer tag", value: (c) => c.consumer_tag},
    {title: "Channel", value: (c) => c.channel_details.name},
    {title: "Ack required", value: (c) => String(c.ack_required)},
    {title: "Prefetch", value: (c) => c.prefetch_count, number: true},
    {title: "Active", value: (c) => String(c.active)},
  ], q.consumer_details || []);
  const bound = table([
    {title: "From exchange", value: (b) => b.source || "(default)"},
    {title: "Routing key", value: (b) => b.routing_key},
  ], bindings);
  const output = el("pre", {id: "queue-output"});
  const getForm = el("form", {class: "inline", id: "get-messages"},
    el("label", {}, "Messages ", el("input", {name: "count", type: "number", value: "1", min: "1"})),
    el("select", {name: "ackmode"}, ["ack_requeue_true", "ack_requeue_false", "reject_requeue_true",
                                     "reject_requeue_false"].map((mode) => el("option", {}, mode))),
    el("button", {type: "submit"}, "Get messages"));
  getForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const got = await api("POST", path + "/get", {count: Number(getForm.count.value), ackmode: getForm.ackmode.value,
                                                    encoding: "auto"});
      output.textContent = got.length ? got.map((m) => `${m.routing_key}: ${m.payload}`).join("\n") : "Queue is empty";
    } catch (error) {
      showError(error);
    }
  });
  const publishForm = el("form", {class: "inline", id: "publish-message"},
    el("input", {name: "payload", placeholder: "Payload", required: true}),
    el("button", {type: "submit"}, "Publish message"));
  publishForm.addEventListener("submit", (event) => {
    event.preventDefault();
    act(() => api("POST", `/exchanges/${enc(vhost)}/amq.default/publish`,
                  {routing_key: name, payload: publishForm.payload.value, payload_encoding: "string", properties: {}}));
  });
  const buttons = el("div", {class: "inline"},
    el("button", {id: "purge", onclick: () => act(() => api("DELETE", path + "/contents"))}, "Purge"),
    el("button", {id: "delete", onclick: () => act(async () => {
      await api("DELETE", path);
      location.hash = "#/queues";
    })}, "Delete queue"));
  return el("div", {}, el("h1", {}, `Queue ${name}`), details, el("h2", {}, "Message rates"), chart(q.message_stats),
            el("h2", {}, "Publish a message"), publishForm, el("h2", {}, "Get messages"), getForm, output,
            el("h2", {}, "Consumers"), consumers, el("h2", {}, "Bindings"), bound, el("h2", {}, "Purge or delete"),
            buttons);
}
queue.refresh = true;

async function exchanges() {
  const list = await api("GET", "/exchanges");
  return el("div", {}, el("h1", {}, `Exchanges (${list.length})`), table([
    {title: "Name", value: (x) => x.name || "(AMQP default)"},
    {title: "Virtual host", value: (x) => x.vhost},
    {title: "Type", value: (x) => x.type},
    {title: "Features", value: (x) => [x.durable && "D", x.auto_delete && "AD", x.internal && "I"].filter(Boolean).join(" ")},
    {title: "Policy", value: (x) => x.policy || ""},
  ], list, {sortable: true, id: "exchanges"}));
}

async function connections() {
  const [list, channels] = await Promise.all([api("GET", "/connections"), api("GET", "/channels")]);
  return el("div", {}, el("h1", {}, `Connections (${list.length})`), table([
    {title: "Name", value: (c) => (c.user_provided_name ? `${c.name} (${c.user_provided_name})` : c.name)},
    {title: "Client", value: (c) => [(c.client_properties || {}).product, (c.client_properties || {}).client_id]
      .filter((part) => typeof part === "string").join(" ")},
    {title: "Protocol", value: (c) => c.protocol},
    {title: "User", value: (c) => c.user},
    {title: "Virtual host", value: (c) => c.vhost},
    {title: "TLS", value: (c) => (c.ssl ? "yes" : "no")},
    {title: "Channels", value: (c) => c.channels, number: true},
    {title: "From client", value: (c) => bytesRate(c.recv_oct_details)},
    {title: "To client", value: (c) => bytesRate(c.send_oct_details)},
    {title: "", value: () => "", render: (c) => el("button", {
      class: "close-connection",
      onclick: () => act(() => api("DELETE", `/connections/${enc(c.name)}`)),
    }, "Close")},
  ], list, {sortable: true, id: "connections"}), el("h2", {}, `Channels (${channels.length})`), table([
    {title: "Channel", value: (c) => c.name},
    {title: "User", value: (c) => c.user},
    {title: "Prefetch", value: (c) => c.prefetch_count, number: true},
    {title: "Unacked", value: (c) => c.messages_unacknowledged, number: true},
    {title: "Consumers", value: (c) => c.consumer_count, number: true},
    {title: "Publish", value: (c) => rate(c.message_stats, "publish")},
    {title: "Deliver/get", value: (c) => rate(c.message_stats, "deliver_get")},
    {title: "Ack", value: (c) => rate(c.message_stats, "ack")},
  ], channels, {sortable: true, id: "channels"}));
}
connections.refresh = true;

function form(id, fields, submitLabel, onSubmit) {
  const node = el("form", {class: "inline", id}, fields.map(([field, placeholder, type]) =>
    el("input", {name: field, placeholder, type: type || "text"})), el("button", {type: "submit"}, submitLabel));
  node.addEventListener("submit", (event) => {
    event.preventDefault();
    act(() => onSubmit(node));
  });
  return node;
}

// As RabbitMQ's UI: a user made here logs in with a password, and a blank one never logs in.
function checkedPassword(password) {
  if (password === "") throw new Error("Please specify a password.");
  return password;
}

const remove = (label, path) => el("button", {onclick: () => act(() => api("DELETE", path))}, label);

async function admin() {
  const content = el("div", {}, el("h1", {}, "Admin"));
  if (has("administrator")) {
    const [users, vhosts, permissions, topicPermissions] = await Promise.all([
      api("GET", "/users"), api("GET", "/vhosts"), api("GET", "/permissions"), api("GET", "/topic-permissions")]);
    content.append(el("h2", {}, "Users"), table([
      {title: "Name", value: (u) => u.name},
      {title: "Tags", value: (u) => [].concat(u.tags).join(", ")},
      {title: "", value: () => "", render: (u) => remove("Delete", `/users/${enc(u.name)}`)},
    ], users, {id: "users"}), form("add-user", [["name", "Username"], ["password", "Password", "password"],
                                                ["tags", "Tags (comma-separated)"]], "Add user",
      (f) => api("PUT", `/users/${enc(f.name.value)}`, {password: checkedPassword(f.password.value),
                                                        tags: f.tags.value})));
    content.append(el("h2", {}, "Virtual hosts"), table([
      {title: "Name", value: (v) => v.name},
      {title: "Description", value: (v) => v.description || ""},
      {title: "", value: () => "", render: (v) => remove("Delete", `/vhosts/${enc(v.name)}`)},
    ], vhosts, {id: "vhosts"}), form("add-vhost", [["name", "Name"], ["description", "Description"]], "Add virtual host",
      (f) => api("PUT", `/vhosts/${enc(f.name.value)}`, {description: f.description.value})));
    content.append(el("h2", {}, "Permissions"), table([
      {title: "User", value: (p) => p.user}, {title: "Virtual host", value: (p) => p.vhost},
      {title: "Configure", value: (p) => p.configure}, {title: "Write", value: (p) => p.write},
      {title: "Read", value: (p) => p.read},
      {title: "", value: () => "", render: (p) => remove("Clear", `/permissions/${enc(p.vhost)}/${enc(p.user)}`)},
    ], permissions, {id: "permissions"}), form("set-permissions", [["user", "User"], ["vhost", "Virtual host"],
      ["configure", "Configure regex"], ["write", "Write regex"], ["read", "Read regex"]], "Set permissions",
      (f) => api("PUT", `/permissions/${enc(f.vhost.value)}/${enc(f.user.value)}`,
                 {configure: f.configure.value, write: f.write.value, read: f.read.value})));
    content.append(el("h2", {}, "Topic permissions"), table([
      {title: "User", value: (p) => p.user}, {title: "Virtual host", value: (p) => p.vhost},
      {title: "Exchange", value: (p) => p.exchange}, {title: "Write", value: (p) => p.write},
      {title: "Read", value: (p) => p.read},
      {title: "", value: () => "", render: (p) => remove("Clear",
        `/topic-permissions/${enc(p.vhost)}/${enc(p.user)}?exchange=${enc(p.exchange)}`)},
    ], topicPermissions, {id: "topic-permissions"}), form("set-topic-permissions", [["user", "User"],
      ["vhost", "Virtual host"], ["exchange", "Exchange"], ["write", "Write regex"], ["read", "Read regex"]],
      "Set topic permission", (f) => api("PUT", `/topic-permissions/${enc(f.vhost.value)}/${enc(f.user.value)}`,
                                         {exchange: f.exchange.value, write: f.write.value, read: f.read.value})));
  }
  const policies = await api("GET", "/policies");
  content.append(el("h2", {}, "Policies"), table([
    {title: "Virtual host", value: (p) => p.vhost}, {title: "Name", value: (p) => p.name},
    {title: "Pattern", value: (p) => p.pattern}, {title: "Apply to", value: (p) => p["apply-to"]},
    {title: "Definition", value: (p) => JSON.stringify(p.definition)}, {title: "Priority", value: (p) => p.priority},
    {title: "", value: () => "", render: (p) => remove("Delete", `/policies/${enc(p.vhost)}/${enc(p.name)}`)},
  ], policies, {id: "policies"}), form("add-policy", [["vhost", "Virtual host"], ["name", "Name"],
    ["pattern", "Pattern"], ["definition", 'Definition, e.g. {"max-length": 100}'], ["priority", "Priority"]],
    "Add policy", (f) => api("PUT", `/policies/${enc(f.vhost.value)}/${enc(f.name.value)}`, {
      pattern: f.pattern.value, definition: JSON.parse(f.definition.value || "{}"),
      priority: Number(f.priority.value || 0), "apply-to": "all"})));
  content.append(...await shovels(), ...await federation());
  return content;
}

// The shovels: their definitions (policymaker, administrator), their state where the user may see it (monitoring);
// the URIs are not shown, as they hold credentials.
async function shovels() {
  const defined = await api("GET", "/parameters/shovel");
  const states = has("monitoring", "administrator") ? await api("GET", "/shovels") : [];
  const state = (s) => states.find((e) => e.vhost === s.vhost && e.name === s.name) || {};
  const path = (s) => `/shovels/vhost/${enc(s.vhost)}/${enc(s.name)}`;
  const end = (s, side) => s.value[`${side}-queue`] ?? s.value[`${side}-exchange`] ?? "";
  return [el("h2", {}, "Shovels"), table([
    {title: "Virtual host", value: (s) => s.vhost}, {title: "Name", value: (s) => s.name},
    {title: "From", value: (s) => end(s, "src")}, {title: "To", value: (s) => end(s, "dest")},
    {title: "State", value: (s) => state(s).state || ""}, {title: "Forwarded", value: (s) => state(s).forwarded ?? ""},
    {title: "Reason", value: (s) => state(s).reason || ""},
    {title: "", value: () => "", render: (s) => el("span", {}, remove("Restart", `${path(s)}/restart`),
                                                     remove("Delete", path(s)))},
  ], defined, {id: "shovels"}), form("add-shovel", [["vhost", "Virtual host"], ["name", "Name"],
    ["src-uri", "Source URI, e.g. amqp://user:password@host/%2F", "password"], ["src-queue", "Source queue"],
    ["dest-uri", "Destination URI", "password"], ["dest-queue", "Destination queue"]], "Add shovel",
    (f) => api("PUT", `/parameters/shovel/${enc(f.vhost.value)}/${enc(f.name.value)}`, {value: {
      "src-uri": f["src-uri"].value, "src-queue": f["src-queue"].value, "dest-uri": f["dest-uri"].value,
      "dest-queue": f["dest-queue"].value}}))];
}

// Federation: the upstreams (policymaker, administrator; their URIs, which hold credentials, not shown) and the
// links the policies made, with their status and a restart (monitoring). A policy with federation-upstream makes a
// queue or exchange federated.
async function federation() {
  const upstreams = await api("GET", "/parameters/federation-upstream");
  const links = has("monitoring", "administrator") ? await api("GET", "/federation-links") : [];
  const restart = (l) => `/federation-links/vhost/${enc(l.vhost)}/${enc(l.id)}/${enc(l.node)}/restart`;
  return [el("h2", {}, "Federation upstreams"), table([
    {title: "Virtual host", value: (u) => u.vhost}, {title: "Name", value: (u) => u.name},
    {title: "Exchange", value: (u) => u.value.exchange ?? ""}, {title: "Queue", value: (u) => u.value.queue ?? ""},
    {title: "Max hops", value: (u) => u.value["max-hops"] ?? 1},
    {title: "", value: () => "", render: (u) => remove(
      "Delete", `/parameters/federation-upstream/${enc(u.vhost)}/${enc(u.name)}`)},
  ], upstreams, {id: "federation-upstreams"}), form("add-federation-upstream", [["vhost", "Virtual host"],
    ["name", "Name"], ["uri", "URI, e.g. amqp://user:password@host/%2F", "password"]], "Add upstream",
    (f) => api("PUT", `/parameters/federation-upstream/${enc(f.vhost.value)}/${enc(f.name.value)}`, {value: {
      uri: f.uri.value}})),
  el("h2", {}, "Federation links"), table([
    {title: "Virtual host", value: (l) => l.vhost}, {title: "Type", value: (l) => l.type},
    {title: "Federated", value: (l) => l.exchange ?? l.queue}, {title: "Upstream", value: (l) => l.upstream},
    {title: "From", value: (l) => `${l.upstream_exchange ?? l.upstream_queue} on ${l.uri}`},
    {title: "Status", value: (l) => l.status}, {title: "Error", value: (l) => l.error || ""},
    {title: "", value: () => "", render: (l) => remove("Restart", restart(l))},
  ], links, {id: "federation-links"})];
}

async function definitions() {
  const download = el("button", {id: "download-definitions", onclick: () => act(async () => {
    const data = await api("GET", "/definitions");
    const link = el("a", {href: URL.createObjectURL(new Blob([JSON.stringify(data, null, 2)],
                                                          {type: "application/json"})),
                          download: "warren-definitions.json"});
    link.click();
  })}, "Download definitions");
  const upload = el("form", {class: "inline", id: "upload-definitions"},
    el("input", {type: "file", name: "file", accept: "application/json,.json", required: true}),
    el("button", {type: "submit"}, "Upload definitions"));
  upload.addEventListener("submit", (event) => {
    event.preventDefault();
    act(async () => {
      const text = await upload.file.files[0].text();
      await api("POST", "/definitions", JSON.parse(text));
      document.getElementById("status").textContent = "Definitions imported";
    });
  });
  return el("div", {}, el("h1", {}, "Definitions"),
            el("p", {}, "Export or import vhosts, users, permissions, policies, queues, exchanges and bindings, in ",
               "RabbitMQ's definitions format."), download, el("h2", {}, "Import"), upload);
}

if (credentials) start().catch(() => sessionStorage.removeItem("warren-credentials"));
