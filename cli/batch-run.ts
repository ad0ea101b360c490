import { createHash } from 'node:crypto';
import fs from 'node:fs';
import { SingleBar } from 'cli-progress';
import { BatchItemInput, BatchView, SapApiError, SapClient } from '../client';

export interface BatchRunOptions {
  agent: string;
  itemsFile: string;
  out: string;
  concurrency?: number;
  maxAttempts?: number;
  /** Poll interval for counts and results. */
  pollMs?: number;
  stderr?: NodeJS.WritableStream;
}

/** What `batch run` remembers next to the --out file, to attach to the same batch when rerun. */
interface BatchMarker {
  batch_id: string;
  agent_id: string;
  items_sha256: string;
}

/** Reads an NDJSON items file: one `{ input, metadata? }` per non-empty line. */
export function readItems(file: string): { items: BatchItemInput[]; sha256: string } {
  const text = fs.readFileSync(file, 'utf8');
  const items: BatchItemInput[] = [];
  text.split('\n').forEach((line, i) => {
    if (!line.trim()) return;
    try {
      items.push(JSON.parse(line) as BatchItemInput);
    } catch {
      throw new Error(`${file}:${i + 1}: not JSON`);
    }
  });
  return { items, sha256: createHash('sha256').update(text).digest('hex') };
}

/**
 * The indexes already in the results file. A last line cut short by an interruption is removed
 * so the file ends with a whole line.
 */
export function readDone(out: string): Set<number> {
  const done = new Set<number>();
  if (!fs.existsSync(out)) return done;
  const text = fs.readFileSync(out, 'utf8');
  const whole = text.endsWith('\n') ? text : text.slice(0, text.lastIndexOf('\n') + 1);
  if (whole.length !== text.length) fs.truncateSync(out, Buffer.byteLength(whole));
  for (const line of whole.split('\n')) {
    if (!line) continue;
    const index = (JSON.parse(line) as { index: number }).index;
    done.add(index);
  }
  return done;
}

/**
 * `sap batch run`: starts (or, when rerun with the same items and --out, attaches to) a batch,
 * shows a progress bar on stderr, and appends each finished item's result to --out in index
 * order. Interrupted and run again, it resumes after the last line written. Answers the exit
 * code: 0 when every item completed, 1 otherwise.
 */
export async function batchRun(client: SapClient, o: BatchRunOptions, signal: AbortSignal): Promise<number> {
  const stderr = o.stderr ?? process.stderr;
  const { items, sha256 } = readItems(o.itemsFile);
  if (items.length === 0) throw new Error(`${o.itemsFile} holds no items`);
  const markerFile = `${o.out}.batch`;
  let marker: BatchMarker | null = fs.existsSync(markerFile) ? (JSON.parse(fs.readFileSync(markerFile, 'utf8')) as BatchMarker) : null;
  if (marker && (marker.items_sha256 !== sha256 || marker.agent_id !== o.agent)) {
    throw new Error(`${o.out} belongs to another batch (${marker.batch_id}) of other items or another agent; choose another --out`);
  }
  let batch: BatchView;
  if (marker) {
    batch = await client.batches.get(o.agent, marker.batch_id);
    stderr.write(`attaching to ${batch.id} (${batch.status})\n`);
  } else {
    // The key derives from the items file, so a rerun before the marker was written attaches too.
    const key = `cli-${o.agent}-${sha256}`;
    batch = await client.batches.create(o.agent, { items, concurrency: o.concurrency, maxAttempts: o.maxAttempts }, { idempotencyKey: key, ndjson: true });
    marker = { batch_id: batch.id, agent_id: o.agent, items_sha256: sha256 };
    fs.writeFileSync(markerFile, `${JSON.stringify(marker)}\n`);
    stderr.write(`batch ${batch.id}: ${batch.total} items, concurrency ${batch.concurrency}\n`);
  }

  const done = readDone(o.out);
  let after = -1;
  while (done.has(after + 1)) after++;
  const fd = fs.openSync(o.out, 'a');
  const bar = new SingleBar({
    stream: stderr as NodeJS.WriteStream,
    format: '{bar} {value}/{total} done | {failed} failed | {running} running | {rate}/s | ETA {eta_formatted}',
    noTTYOutput: true,
    notTTYSchedule: 1000,
    etaBuffer: 50,
    hideCursor: false,
  });
  const t0 = Date.now();
  const startDone = batch.counts.completed + batch.counts.failed;
  const payload = (b: BatchView) => {
    const secs = (Date.now() - t0) / 1000;
    const rate = secs > 0 ? ((b.counts.completed + b.counts.failed - startDone) / secs).toFixed(1) : '0.0';
    return { failed: b.counts.failed, running: b.counts.running, rate };
  };
  bar.start(batch.total, batch.counts.completed + batch.counts.failed, payload(batch));
  let written = done.size;
  let lastCounts = 0;
  try {
    for (;;) {
      if (signal.aborted) break;
      if (Date.now() - lastCounts >= (o.pollMs ?? 1000)) {
        batch = await client.batches.get(o.agent, batch.id);
        bar.update(batch.counts.completed + batch.counts.failed, payload(batch));
        lastCounts = Date.now();
      }
      const page = await client.batches.results(o.agent, batch.id, { after });
      for (const line of page.lines) {
        if (!done.has(line.index)) {
          fs.writeSync(fd, `${JSON.stringify(line)}\n`);
          done.add(line.index);
          written++;
        }
      }
      after = page.nextAfter;
      if (page.lines.length > 0) continue;
      if (page.batchStatus !== 'running' && after >= page.total - 1) break;
      await new Promise((r) => setTimeout(r, Math.min(o.pollMs ?? 1000, 500)));
    }
  } catch (err) {
    if (!(signal.aborted && (err as Error).name === 'AbortError')) throw err;
  } finally {
    fs.closeSync(fd);
    bar.stop();
  }
  if (signal.aborted) {
    stderr.write(`interrupted: ${written}/${batch.total} results in ${o.out}; the batch keeps running. Run the same command again to resume.\n`);
    return 130;
  }
  const final = await client.batches.get(o.agent, batch.id);
  stderr.write(`batch ${final.id} ${final.status}: ${final.counts.completed} completed, ${final.counts.failed} failed; ${written} results in ${o.out}\n`);
  const summary = failureSummary(o.out);
  if (summary) stderr.write(summary);
  return final.status === 'completed' && final.counts.failed === 0 ? 0 : 1;
}

/**
 * The failed items of a results file, grouped by reason, and within a reason by the first line
 * of their message (the most frequent first, five at most): what to look at first.
 */
export function failureSummary(resultsFile: string): string {
  const byReason = new Map<string, Map<string, number>>();
  let failed = 0;
  for (const text of fs.readFileSync(resultsFile, 'utf8').split('\n')) {
    if (!text.trim()) continue;
    let line: { status?: string; error?: { reason?: string | null; message?: string | null } };
    try {
      line = JSON.parse(text);
    } catch {
      continue;
    }
    if (line.status === 'completed') continue;
    failed++;
    const reason = line.error?.reason ?? 'unknown';
    const first = (line.error?.message ?? '').split('\n')[0]!.slice(0, 200) || '(no message)';
    const messages = byReason.get(reason) ?? new Map<string, number>();
    messages.set(first, (messages.get(first) ?? 0) + 1);
    byReason.set(reason, messages);
  }
  if (!failed) return '';
  const out = [`failures by reason (${failed}):`];
  const total = (m: Map<string, number>) => [...m.values()].reduce((a, b) => a + b, 0);
  for (const [reason, messages] of [...byReason].sort((a, b) => total(b[1]) - total(a[1]))) {
    out.push(`  ${reason}: ${total(messages)}`);
    const sorted = [...messages].sort((a, b) => b[1] - a[1]);
    for (const [message, n] of sorted.slice(0, 5)) out.push(`    ${n} × ${message}`);
    if (sorted.length > 5) out.push(`    … ${sorted.length - 5} other messages`);
  }
  return `${out.join('\n')}\n`;
}

export { SapApiError };
