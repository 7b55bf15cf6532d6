// A harness as readable lines, and a line diff (longest common subsequence) between two.

import { h } from "./dom.js";

const CONTEXT = 3;
const MAX_CELLS = 4_000_000;

function isEmpty(value) {
  if (value === null || value === undefined || value === "") return true;
  if (Array.isArray(value)) return value.length === 0;
  if (typeof value === "object") return Object.values(value).every(isEmpty);
  return false;
}

/** YAML-like lines of any JSON value: multi-line strings become indented blocks. */
function lines(value, indent, out) {
  const pad = "  ".repeat(indent);
  if (Array.isArray(value)) {
    value.forEach((item) => {
      if (item !== null && typeof item === "object") {
        out.push(`${pad}-`);
        lines(item, indent + 1, out);
      } else {
        String(item).split("\n").forEach((line, i) => out.push(`${pad}${i ? "  " : "- "}${line}`));
      }
    });
  } else if (value !== null && typeof value === "object") {
    for (const [key, item] of Object.entries(value)) {
      if (isEmpty(item)) continue;
      if (item !== null && typeof item === "object") {
        out.push(`${pad}${key}:`);
        lines(item, indent + 1, out);
      } else if (typeof item === "string" && item.includes("\n")) {
        out.push(`${pad}${key}: |`);
        item.split("\n").forEach((line) => out.push(`${pad}  ${line}`));
      } else {
        out.push(`${pad}${key}: ${typeof item === "string" ? item : JSON.stringify(item)}`);
      }
    }
  } else {
    out.push(`${pad}${value}`);
  }
  return out;
}

/** The lines of a harness document ({harness, files}) as /reef/artifacts/{d}/harness
 * returns it; [] for none. */
export function harnessLines(doc) {
  if (!doc) return [];
  const { schema_version: _version, ...fields } = doc.harness;
  const out = lines(fields, 0, []);
  for (const file of doc.files || []) {
    out.push(`file ${file.path} (${file.size_bytes} bytes):`);
    if (file.text !== null) file.text.split("\n").forEach((line) => out.push(`  ${line}`));
  }
  return out;
}

/** [{op: "same"|"add"|"del", text}] turning `before` into `after`. */
export function diffLines(before, after) {
  let start = 0;
  while (start < before.length && start < after.length && before[start] === after[start]) start += 1;
  let endB = before.length;
  let endA = after.length;
  while (endB > start && endA > start && before[endB - 1] === after[endA - 1]) { endB -= 1; endA -= 1; }
  const a = before.slice(start, endB);
  const b = after.slice(start, endA);
  const middle = [];
  if (a.length * b.length > MAX_CELLS) {
    a.forEach((text) => middle.push({ op: "del", text }));
    b.forEach((text) => middle.push({ op: "add", text }));
  } else {
    // lcs[i][j]: common length of a[i:] and b[j:]
    const lcs = Array.from({ length: a.length + 1 }, () => new Uint32Array(b.length + 1));
    for (let i = a.length - 1; i >= 0; i -= 1) {
      for (let j = b.length - 1; j >= 0; j -= 1) {
        lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
      }
    }
    let i = 0;
    let j = 0;
    while (i < a.length || j < b.length) {
      if (i < a.length && j < b.length && a[i] === b[j]) { middle.push({ op: "same", text: a[i] }); i += 1; j += 1; }
      else if (j < b.length && (i === a.length || lcs[i][j + 1] >= lcs[i + 1][j])) { middle.push({ op: "add", text: b[j] }); j += 1; }
      else { middle.push({ op: "del", text: a[i] }); i += 1; }
    }
  }
  return [
    ...before.slice(0, start).map((text) => ({ op: "same", text })),
    ...middle,
    ...before.slice(endB).map((text) => ({ op: "same", text })),
  ];
}

/** The diff as a block, unchanged runs folded to CONTEXT lines around each change. */
export function diffView(entries) {
  const changed = entries.map((entry) => entry.op !== "same");
  const near = entries.map((_, i) => {
    for (let k = Math.max(0, i - CONTEXT); k <= Math.min(entries.length - 1, i + CONTEXT); k += 1) {
      if (changed[k]) return true;
    }
    return false;
  });
  const rows = [];
  let hidden = 0;
  entries.forEach((entry, i) => {
    if (!near[i]) { hidden += 1; return; }
    if (hidden) { rows.push(h("div", { class: "gap" }, `… ${hidden} unchanged lines`)); hidden = 0; }
    const mark = entry.op === "add" ? "+ " : entry.op === "del" ? "- " : "  ";
    rows.push(h("div", { class: entry.op }, mark + entry.text));
  });
  if (hidden) rows.push(h("div", { class: "gap" }, `… ${hidden} unchanged lines`));
  return h("div", { class: "diff" }, rows);
}
