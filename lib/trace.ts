/**
 * Step timestamps for finding where a request waits (docs/performance.md, "Tracing a burst"). Off
 * unless SAP_TRACE_DIR is set: then every process appends `epoch-ms<TAB>process<TAB>key<TAB>step`
 * lines to its own file there (`<process>.<pid>.tsv`, the process named by its script's folder), buffered and written every 200 ms and at exit.
 * A debugging aid for benches: never on in production.
 */
import fs from 'node:fs';
import path from 'node:path';

const dir = process.env.SAP_TRACE_DIR;
const lines: string[] = [];
/** The process, by the folder of its script: `host`, `api`, `worker`, `scripts` (a bench). */
const name = path.basename(path.dirname(process.argv[1] ?? 'proc'));
const file = dir ? path.join(dir, `${name}.${process.pid}.tsv`) : null;

function flush(): void {
  if (!file || lines.length === 0) return;
  fs.appendFileSync(file, lines.join(''), { mode: 0o600 });
  lines.length = 0;
}

/** Epoch milliseconds with the fraction (comparable between processes on one machine). */
export const traceNow = (): number => performance.timeOrigin + performance.now();

/** Records that `key` (a sandbox or request id) reached `step` now, or at `at` (from traceNow). */
export const trace: (key: string, step: string, at?: number) => void = dir
  ? (key, step, at = traceNow()) => {
      if (lines.length === 0) setTimeout(flush, 200).unref();
      lines.push(`${at.toFixed(2)}\t${name}\t${key}\t${step}\n`);
    }
  : () => undefined;

if (dir) {
  process.on('exit', flush);
  // The monotonic clock (µs) at a known epoch time: V8's CPU profiles (--cpu-prof) are timed by it.
  trace('clock', String(process.hrtime.bigint() / 1000n));
}
