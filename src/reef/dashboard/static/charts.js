// Hand-written SVG charts: a line chart (learning and loss curves) and a bar chart
// (per-item differences). Colours come from app.css classes.

import { h, s } from "./dom.js";

const WIDTH = 760;
const MARGIN = { left: 48, right: 18, top: 14, bottom: 38 };

function ticks(low, high, count) {
  if (high === low) return [low];
  const out = [];
  for (let i = 0; i <= count; i += 1) out.push(low + ((high - low) * i) / count);
  return out;
}

function label(value) {
  if (Math.abs(value) >= 100) return value.toFixed(0);
  if (Math.abs(value) >= 10) return value.toFixed(1);
  return value.toFixed(2);
}

function legend(series) {
  if (series.length < 2) return null;
  return h("div", { class: "legend" }, series.map((line, i) =>
    h("span", {}, h("span", { class: ["swatch", `series-${i}`] }), line.name)));
}

/**
 * A line chart. `series`: [{name, points: [{x, y, tip}]}] (y null leaves a gap);
 * options: {width, height, yMin, yMax, xLabel, yLabel, xTickLabel(x), title}.
 */
export function lineChart(series, options = {}) {
  const height = options.height || 240;
  const width = options.width || WIDTH;
  const plotW = width - MARGIN.left - MARGIN.right;
  const plotH = height - MARGIN.top - MARGIN.bottom;
  const all = series.flatMap((line) => line.points).filter((p) => p.y !== null && p.y !== undefined);
  const xs = series.flatMap((line) => line.points.map((p) => p.x));
  const xMin = Math.min(...xs);
  const xMax = Math.max(...xs);
  let yMin = options.yMin ?? Math.min(...all.map((p) => p.y));
  let yMax = options.yMax ?? Math.max(...all.map((p) => p.y));
  if (yMin === yMax) { yMin -= 0.5; yMax += 0.5; }
  const x = (value) => MARGIN.left + (xMax === xMin ? plotW / 2 : ((value - xMin) / (xMax - xMin)) * plotW);
  const y = (value) => MARGIN.top + plotH - ((value - yMin) / (yMax - yMin)) * plotH;

  const svg = s("svg", {
    class: "chart", viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": options.title || "chart",
  });
  for (const value of ticks(yMin, yMax, 4)) {
    svg.append(
      s("line", { class: "grid", x1: MARGIN.left, x2: width - MARGIN.right, y1: y(value), y2: y(value) }),
      s("text", { x: MARGIN.left - 6, y: y(value) + 4, "text-anchor": "end" }, label(value)));
  }
  const xValues = [...new Set(xs)].sort((a, b) => a - b);
  const shown = xValues.length <= 12 ? xValues : ticks(xMin, xMax, 6).map(Math.round);
  const tickLabel = options.xTickLabel || ((value) => String(value));
  for (const value of shown) {
    svg.append(s("text", { x: x(value), y: height - MARGIN.bottom + 16, "text-anchor": "middle" }, tickLabel(value)));
  }
  svg.append(
    s("line", { class: "axis", x1: MARGIN.left, x2: width - MARGIN.right, y1: MARGIN.top + plotH, y2: MARGIN.top + plotH }),
    s("line", { class: "axis", x1: MARGIN.left, x2: MARGIN.left, y1: MARGIN.top, y2: MARGIN.top + plotH }));
  if (options.xLabel) {
    svg.append(s("text", { x: MARGIN.left + plotW / 2, y: height - 4, "text-anchor": "middle" }, options.xLabel));
  }
  if (options.yLabel) {
    svg.append(s("text", { x: 12, y: MARGIN.top + plotH / 2, "text-anchor": "middle",
      transform: `rotate(-90 12 ${MARGIN.top + plotH / 2})` }, options.yLabel));
  }
  series.forEach((line, i) => {
    let path = "";
    let pen = "M";
    for (const point of line.points) {
      if (point.y === null || point.y === undefined) { pen = "M"; continue; }
      path += `${pen}${x(point.x).toFixed(1)},${y(point.y).toFixed(1)} `;
      pen = "L";
    }
    const group = s("g", { class: `series-${i}`, "data-series": line.name });
    if (path) group.append(s("path", { class: ["line", `series-${i}`], d: path.trim() }));
    const radius = line.points.length > 60 ? 2 : 4;
    for (const point of line.points) {
      if (point.y === null || point.y === undefined) continue;
      group.append(s("circle", { class: ["point", `series-${i}`], cx: x(point.x), cy: y(point.y), r: radius },
        s("title", {}, point.tip || `${line.name}: ${label(point.y)}`)));
    }
    svg.append(group);
  });
  return h("figure", { class: "figure" }, svg, legend(series));
}

/**
 * Bars of signed differences (already sorted), a zero line and a dashed mean line.
 * `bars`: [{value, tip}]; options: {height, mean}.
 */
export function barChart(bars, options = {}) {
  const height = options.height || 220;
  const plotW = WIDTH - MARGIN.left - MARGIN.right;
  const plotH = height - MARGIN.top - MARGIN.bottom;
  const reach = Math.max(0.1, ...bars.map((bar) => Math.abs(bar.value)));
  const y = (value) => MARGIN.top + plotH / 2 - (value / reach) * (plotH / 2);
  const step = plotW / Math.max(bars.length, 1);
  const svg = s("svg", {
    class: "chart", viewBox: `0 0 ${WIDTH} ${height}`, role: "img",
    "aria-label": options.title || "per-item differences",
  });
  for (const value of [-reach, -reach / 2, 0, reach / 2, reach]) {
    svg.append(
      s("line", { class: "grid", x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: y(value), y2: y(value) }),
      s("text", { x: MARGIN.left - 6, y: y(value) + 4, "text-anchor": "end" }, label(value)));
  }
  bars.forEach((bar, i) => {
    const top = Math.min(y(bar.value), y(0));
    const size = Math.max(Math.abs(y(bar.value) - y(0)), 1.5);
    const tone = bar.value > 0 ? "pos" : bar.value < 0 ? "neg" : "zero";
    svg.append(s("rect", {
      class: ["bar", tone], x: MARGIN.left + i * step + step * 0.12, y: bar.value === 0 ? y(0) - 0.75 : top,
      width: Math.max(step * 0.76, 1), height: size,
    }, s("title", {}, bar.tip)));
  });
  svg.append(s("line", { class: "zero-line", x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: y(0), y2: y(0) }));
  if (options.mean !== undefined && options.mean !== null) {
    svg.append(s("line", { class: "mean-line", x1: MARGIN.left, x2: WIDTH - MARGIN.right,
      y1: y(options.mean), y2: y(options.mean) }, s("title", {}, `mean ${label(options.mean)}`)));
  }
  svg.append(s("text", { x: MARGIN.left + plotW / 2, y: height - 8, "text-anchor": "middle" },
    `${bars.length} items, sorted by candidate − baseline`));
  return h("figure", { class: "figure" }, svg);
}
