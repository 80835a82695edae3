// Reads a Trace Event Format file (bpftime's --trace output) with Chrome DevTools'
// Performance panel trace engine, and prints, as JSON, what that engine made of it: the
// processes and threads, each thread's slices and instants in the engine's own tree
// (depth, parent), the events it could not place in a tree (slices that overlap without
// nesting), and the flows it joined. tests/tests/trace.rs checks the summary.
//
// Usage: node summarize.mjs TRACE.json
import fs from 'node:fs';
import {createRequire} from 'node:module';
import * as Trace from '@paulirish/trace_engine';
import {polyfillDOMRect} from '@paulirish/trace_engine/analyze-trace.mjs';

const file = process.argv[2];
if (!file) {
  console.error('usage: node summarize.mjs TRACE.json');
  process.exit(2);
}
const json = JSON.parse(fs.readFileSync(file, 'utf8'));
const events = Array.isArray(json) ? json : json.traceEvents;
if (!Array.isArray(events)) {
  console.error(`${file}: no traceEvents array`);
  process.exit(1);
}

polyfillDOMRect();
const model = Trace.TraceModel.Model.createWithAllHandlers();
await model.parse(events);
const data = model.parsedTrace().data;

// The engine keeps microseconds; nanoseconds are what bpftime recorded.
const ns = us => Math.round(us * 1000);
const where = e => ({pid: e.pid, tid: e.tid, name: e.name, cat: e.cat, ts: ns(e.ts)});

const threads = [];
for (const [pid, proc] of data.Renderer.processes) {
  for (const [tid, thread] of proc.threads) {
    const spans = [];
    const instants = [];
    let placed = 0;
    const walk = (node, depth, parent) => {
      placed++;
      const e = node.entry;
      const item = {name: e.name, cat: e.cat, ts: ns(e.ts), depth, parent};
      let index = null;
      if (e.ph === 'X') {
        item.dur = ns(e.dur ?? 0);
        item.args = e.args ?? {};
        index = spans.length;
        spans.push(item);
      } else {
        item.args = e.args ?? {};
        instants.push(item);
      }
      for (const child of node.children) {
        walk(child, depth + 1, index ?? parent);
      }
    };
    for (const root of thread.tree?.roots ?? []) {
      walk(root, 0, null);
    }
    threads.push({
      pid, tid, name: thread.name ?? null, spans, instants,
      unplaced: thread.entries.length - placed,
    });
  }
}

const processNames = {};
for (const e of events) {
  if (e.ph === 'M' && e.name === 'process_name') {
    processNames[e.pid] = e.args?.name ?? null;
  }
}

const flows = data.Flows.flows.map(flow => flow.map(where));

const require = createRequire(import.meta.url);
const engine = require('@paulirish/trace_engine/package.json');
console.log(JSON.stringify({
  consumer: `${engine.name} ${engine.version}`,
  processes: processNames,
  metadata: json.metadata ?? null,
  threads,
  flows,
}));
